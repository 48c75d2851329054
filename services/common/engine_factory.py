"""Build the engine a worker holds from its settings: for the runners over engines/core, the spec of the runner
and the client of an engine process built from it; TensorRT-LLM brings its own executor and is held as is.
Backends are imported lazily (the runners in the engine process only)."""

import functools
from dataclasses import replace

from engines.base import Engine
from engines.base.block_hash import chain_root
from engines.base.engine_configs import TransferConfig
from engines.core.client import EngineClient
from engines.core.loop import EngineSpec
from engines.transfer import transports
from services.common.logs import setup_logging
from services.common.worker_settings import WorkerSettings

# the engine keeps held KV this long past the lease a prefill worker advertises, so a decode engine's READ that
# ended before the advertised lease did never read blocks already given to other requests
HELD_KV_GRACE_S = 2.0


def engine_spec(s: WorkerSettings) -> EngineSpec:
    if s.engine == "zero":
        from engines.zero import zero_spec

        return zero_spec(s.model, batch=s.batch, cache=s.cache)
    if s.engine == "sim":
        from engines.sim import sim_spec

        # "" = the shipped H100 / Llama-3.1-8B profile; a name or a JSON path (e.g. `tandem sim --save-profile`)
        return sim_spec(
            s.sim,
            enable_prefix_caching=s.batch.enable_prefix_caching,
            cache=s.cache,
            transfer=transfer_config(s),
            model=s.model,
        )
    from engines.native import native_spec
    from engines.native.config import EngineConfig

    return native_spec(
        EngineConfig(
            model=s.model,
            dtype=s.dtype,
            device=s.device,
            batch=s.batch,
            # NOTE: off CUDA the pool is a share of the memory available, not of a card
            cache=s.cache if s.device.startswith("cuda") else replace(s.cache, gpu_memory_utilization=0),
            transfer=transfer_config(s),
            num_threads=s.num_threads or None,
            kv_disk_key=s.kv_signing_key() or b"",
            speculation=s.speculation,
        )
    )


def transfer_config(s: WorkerSettings) -> TransferConfig:
    """The worker's transfer sub-config with "auto" resolved to the transport this host can use."""
    return replace(s.transfer_config(HELD_KV_GRACE_S), kv_transport=kv_transport(s))


def kv_transport(s: WorkerSettings) -> str:
    """The transport a worker's engine moves KV with: auto is NIXL when it imports, else the gRPC fallback."""
    if s.transfer.kv_transport != transports.AUTO:
        return s.transfer.kv_transport
    from engines.transfer.nixl_link import is_available

    return transports.NIXL if is_available() else transports.STAGING


def make_engine(s: WorkerSettings) -> Engine:
    """A runner's engine in its own process (its steps never share a GIL with the worker's gRPC streams), or
    TensorRT-LLM's adapter."""
    if s.engine == "trtllm":
        from engines.trtllm import TrtllmConfig, TrtllmEngine

        return TrtllmEngine(
            TrtllmConfig(
                model=s.model,
                dtype=s.dtype,
                device=s.device,
                batch=s.batch,
                cache=s.cache,
                transfer=TransferConfig(transports.TRTLLM, s.kv_lease_s + HELD_KV_GRACE_S),
                trtllm=s.trtllm,
                kv_hash_root=chain_root("", s.kv_hash_secret),
            )
        )
    return EngineClient(
        engine_spec(s), process=True, overlap=s.is_overlapped, log_setup=functools.partial(setup_logging, s.role.value)
    )
