"""One NIXL agent per engine: registers the paged KV cache, says how to reach it (metadata), and READs a
remote engine's blocks straight into local ones, posting runs contiguous on both sides as single pieces, off
the caller's thread. Imported only when NIXL is the transport; the `nixl` meta package exposes `nixl`, a lone
flavour `nixl_cu12` / `nixl_cu13`. It never copies a payload through Python."""

import importlib
import logging
import os
import threading
import time
import uuid
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from engines.transfer.descriptor import DescriptorError, KvDescriptor
from engines.transfer.paged import Geometry, merge_runs

log = logging.getLogger(__name__)
_MODULES = ("nixl._api", "nixl_cu12._api", "nixl_cu13._api")
PROGRESS_THREAD_ENV = "TANDEM_NIXL_PROGRESS_THREAD"
PUMP_INTERVAL_S = 0.005  # NOTE: only connection set-up waits on it; the bytes of a READ never do
# a reader's view of a source agent gains each request's regions; it is dropped and loaded afresh after this many
# (when no READ is in flight), since NIXL has no call that forgets one region
MAX_REMOTE_LOADS = 512


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


@dataclass(frozen=True, slots=True)
class NixlSettings:
    # NOTE: off by default: NIXL's progress thread spins (about 40 % of a core while idle) and, on a small host,
    # took the cores the copies need (1.2 vs 3.8-5.5 GB/s for 268 MB between two processes, bench/RESULTS.md)
    progress_thread: bool = False

    @classmethod
    def from_env(cls) -> "NixlSettings":
        raw = os.environ.get(PROGRESS_THREAD_ENV, "0")
        if raw not in ("0", "1"):
            raise ValueError(f"{PROGRESS_THREAD_ENV} must be 0 or 1, got {raw!r}")
        return cls(progress_thread=raw == "1")


@dataclass(slots=True)
class Transfer:
    """A READ in flight: its post on the link's poster thread, which yields NIXL's handle and first state."""

    posted: Future
    error: str = ""  # why it failed to post (the request's error)


class NixlLink:
    def __init__(self, geometry: Geometry, name_prefix: str = "tandem", settings: NixlSettings | None = None):
        api = nixl_api()
        if api is None:
            raise RuntimeError("NIXL is not installed (pip install nixl, or nixl-cu12 / nixl-cu13)")
        settings = settings or NixlSettings.from_env()
        self.geometry = geometry
        self.name = f"{name_prefix}-{os.getpid()}-{uuid.uuid4().hex[:8]}"  # NOTE: unique per process
        # NOTE: STRICT: the poster and the pump call the agent beside the engine's thread
        config = api.nixl_agent_config(
            enable_prog_thread=settings.progress_thread,
            backends=["UCX"],
            sync_mode=api.nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT,
        )
        self.agent = api.nixl_agent(self.name, config)
        # NOTE: the whole cache, as the destination of this engine's READs; its metadata never leaves the process
        self.agent.register_memory([(geometry.base, geometry.nbytes, geometry.device_id, "")], geometry.mem)
        self._exposed: dict[str, object] = {}  # key -> the registration of one request's blocks, for readers
        self._remote_loads: dict[str, int] = {}  # agent -> request metadata loaded into our view of it
        self._num_inflight = 0
        self._poster = ThreadPoolExecutor(1, thread_name_prefix="nixl-post")
        if not settings.progress_thread:
            _start_pump(self)

    def expose(self, key: str, block_ids) -> bytes:
        """Register just these blocks (their runs in every plane) and return agent metadata naming only them: a
        reader's NIXL can READ nothing else of this cache through it. `conceal(key)` deregisters them."""
        pieces = self.geometry.pieces(block_ids)
        runs, _ = merge_runs(pieces, pieces)  # NOTE: one region per run of consecutive blocks, per plane
        self.conceal(key)
        regions = self.agent.register_memory(
            [(int(a), int(n), int(d), "") for a, n, d in runs], self.geometry.mem, backends=["UCX"]
        )
        self._exposed[key] = regions
        return self.agent.get_partial_agent_metadata(regions, True, ["UCX"])

    def conceal(self, key: str) -> None:
        regions = self._exposed.pop(key, None)
        if regions is not None:
            self.agent.deregister_memory(regions, backends=["UCX"])

    def read(self, desc: KvDescriptor, block_ids) -> Transfer:
        """Start one READ of `desc`'s blocks into local `block_ids`; the transfer to poll with `state`. An agent
        seen for the first time is loaded here (DescriptorError when its metadata is not its own); a known one's
        further regions are loaded on the poster thread, off the engine's."""
        is_new = desc.agent not in self._remote_loads
        if is_new:
            self._remote(desc)
        local, remote = merge_runs(self.geometry.pieces(block_ids), self._remote_geometry(desc).pieces(desc.block_ids))
        self._num_inflight += 1
        return Transfer(self._poster.submit(self._post, local, remote, desc, not is_new))

    def state(self, transfer: Transfer) -> str:
        """ "DONE", "PROC" or "ERR"; a transfer that is done or failed is released."""
        if not transfer.posted.done():
            return "PROC"
        try:
            handle, state = transfer.posted.result()
        except Exception as exc:  # NOTE: NIXL refuses pieces outside what either side registered
            log.warning("NIXL could not post a READ: %r", exc)
            transfer.error = str(exc) if isinstance(exc, DescriptorError) else ""
            self._num_inflight -= 1
            return "ERR"
        try:
            if state == "PROC":
                state = self.agent.check_xfer_state(handle)
        except Exception as exc:  # NOTE: a remote that went away raises here
            log.warning("NIXL transfer failed: %r", exc)
            state = "ERR"
        if state != "PROC":  # NOTE: on the poster too: another READ may be copying under the agent's lock
            self._num_inflight -= 1
            self._poster.submit(self.agent.release_xfer_handle, handle)
        return state

    def _post(self, local, remote, desc: KvDescriptor, is_load_due: bool) -> tuple[object, str]:
        """On the poster thread, as the agent's lock is held while a shared-memory READ is copied inside its post
        (CMA): the engine's thread never waits on a copy."""
        if is_load_due:  # NOTE: here, not on the engine's thread: loading metadata takes a millisecond or two
            self._remote(desc)
        handle = self.agent.initialize_xfer(
            "READ",
            self.agent.get_xfer_descs(local, self.geometry.mem),
            self.agent.get_xfer_descs(remote, desc.mem),
            desc.agent,
        )
        try:
            return handle, self.agent.transfer(handle)
        except Exception:
            self.agent.release_xfer_handle(handle)
            raise

    def _remote(self, desc: KvDescriptor) -> None:
        """Load the request's metadata (its blocks' regions) into our view of the source agent (on the poster
        thread; the READ being posted is the one in flight when the view is dropped)."""
        if self._remote_loads.get(desc.agent, 0) >= MAX_REMOTE_LOADS and self._num_inflight <= 1:
            self.forget(desc.agent)
        try:
            name = self.agent.add_remote_agent(desc.metadata)
        except Exception as exc:
            raise DescriptorError(f"unknown NIXL agent {desc.agent!r}: its metadata cannot be loaded ({exc})") from exc
        if isinstance(name, bytes):
            name = name.decode()
        if name != desc.agent:
            raise DescriptorError(f"unknown NIXL agent {desc.agent!r}: the metadata is {name!r}'s")
        self._remote_loads[desc.agent] = self._remote_loads.get(desc.agent, 0) + 1

    def _remote_geometry(self, desc: KvDescriptor) -> Geometry:
        return Geometry.of(desc.layout, desc.num_pool_blocks, desc.base, desc.mem, desc.device_id)

    def forget(self, agent: str) -> None:
        if self._remote_loads.pop(agent, None) is not None:
            self.agent.remove_remote_agent(agent)


def _start_pump(link: NixlLink) -> None:
    """Without NIXL's progress thread, a peer's connection set-up waits on this agent's progress: a thread
    progresses it every PUMP_INTERVAL_S, holding the link only weakly (it ends when the link is dropped)."""
    ref = weakref.ref(link)

    def pump() -> None:
        while True:
            time.sleep(PUMP_INTERVAL_S)
            live = ref()
            if live is None:
                return
            try:
                live.agent.get_new_notifs()
            except Exception as exc:  # NOTE: a progress failure is the transfers' to report, not the pump's
                log.debug("NIXL progress failed: %r", exc)
            del live

    threading.Thread(target=pump, name="nixl-pump", daemon=True).start()
