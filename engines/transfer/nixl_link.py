"""One NIXL agent per engine: registers the paged KV cache, says how to reach it (metadata), and READs a
remote engine's blocks straight into local ones. Imported only when NIXL is the transport; the `nixl` meta
package exposes `nixl`, a lone flavour `nixl_cu12` / `nixl_cu13`."""
import importlib
import logging
import os
import uuid

import numpy as np

from engines.transfer.descriptor import DescriptorError, KvDescriptor
from engines.transfer.paged import Geometry

log = logging.getLogger(__name__)
_MODULES = ("nixl._api", "nixl_cu12._api", "nixl_cu13._api")


def nixl_api():
    """NIXL's Python API, or None when no flavour is installed."""
    for name in _MODULES:
        try:
            api = importlib.import_module(name)
        except ImportError:
            continue
        _adopt_logging()
        return api
    return None


def _adopt_logging() -> None:
    """NIXL gives its "nixl" logger a plain-text stdout handler of its own; its records go through the process's
    handlers instead, so a worker's log stays one JSON object per line."""
    nixl_logger = logging.getLogger("nixl")
    for handler in list(nixl_logger.handlers):
        nixl_logger.removeHandler(handler)
    nixl_logger.propagate = True


def is_available() -> bool:
    return nixl_api() is not None


class NixlLink:
    def __init__(self, geometry: Geometry, name_prefix: str = "tandem"):
        api = nixl_api()
        if api is None:
            raise RuntimeError("NIXL is not installed (pip install nixl, or nixl-cu12 / nixl-cu13)")
        self.geometry = geometry
        self.name = f"{name_prefix}-{os.getpid()}-{uuid.uuid4().hex[:8]}"  # NOTE: unique per process
        self.agent = api.nixl_agent(self.name, api.nixl_agent_config(backends=["UCX"]))
        self.agent.register_memory([(geometry.base, geometry.nbytes, geometry.device_id, "")], geometry.mem)
        self.local = self.agent.prep_xfer_dlist("", geometry.region_table(), geometry.mem)
        self.metadata = self.agent.get_agent_metadata()
        self._remotes: dict[str, object] = {}  # agent name -> its prepped region list

    def read(self, desc: KvDescriptor, block_ids) -> object:
        """Post one READ of `desc`'s blocks into local `block_ids`; the transfer handle to poll."""
        remote = self._remote(desc)
        handle = self.agent.make_prepped_xfer("READ", self.local, self.geometry.indices(block_ids), remote,
                                              self._remote_geometry(desc).indices(desc.block_ids))
        state = self.agent.transfer(handle)
        if state == "ERR":
            self.agent.release_xfer_handle(handle)
            raise ConnectionError(f"NIXL could not post a READ from agent {desc.agent}")
        return handle

    def state(self, handle) -> str:
        """"DONE", "PROC" or "ERR"; a handle that is done or failed is released."""
        try:
            state = self.agent.check_xfer_state(handle)
        except Exception as exc:  # NOTE: a remote that went away raises here
            log.warning("NIXL transfer failed: %r", exc)
            state = "ERR"
        if state != "PROC":
            self.agent.release_xfer_handle(handle)
        return state

    def _remote(self, desc: KvDescriptor):
        remote = self._remotes.get(desc.agent)
        if remote is None:
            try:
                name = self.agent.add_remote_agent(desc.metadata)
            except Exception as exc:
                raise DescriptorError(f"unknown NIXL agent {desc.agent!r}: its metadata cannot be loaded ({exc})")
            if isinstance(name, bytes):
                name = name.decode()
            if name != desc.agent:
                raise DescriptorError(f"unknown NIXL agent {desc.agent!r}: the metadata is {name!r}'s")
            table = self._remote_geometry(desc).region_table()
            remote = self._remotes[desc.agent] = self.agent.prep_xfer_dlist(desc.agent, table, desc.mem)
        return remote

    def _remote_geometry(self, desc: KvDescriptor) -> Geometry:
        return Geometry.of(desc.layout, desc.num_pool_blocks, desc.base, desc.mem, desc.device_id)

    def forget(self, agent: str) -> None:
        if self._remotes.pop(agent, None) is not None:
            self.agent.remove_remote_agent(agent)
