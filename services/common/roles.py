"""The one spelling of a worker's role in Python; services/common/convert.py is where it meets the proto enum."""

from enum import Enum


class WorkerRole(str, Enum):
    PREFILL = "prefill"
    DECODE = "decode"
