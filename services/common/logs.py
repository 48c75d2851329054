"""Logging set-up for every service: one line per record, service name included.
(JSON lines with trace ids come with the observability issue.)"""
import logging
import os


def setup_logging(service: str) -> None:
    level = os.environ.get("TANDEM_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(level=level, format=f"%(asctime)s %(levelname)s {service} %(name)s: %(message)s")
