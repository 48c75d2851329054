"""Build the engine a worker holds from its settings. Backends are imported lazily."""
from engines.base import Engine
from services.common.worker_settings import WorkerSettings


def make_engine(s: WorkerSettings) -> Engine:
    if s.engine == "zero":
        from engines.zero import ZeroCostEngine

        return ZeroCostEngine(s.model, block_size=s.block_size)
    if s.engine == "trtllm":
        from engines.trtllm import TrtllmConfig, TrtllmEngine

        return TrtllmEngine(TrtllmConfig(
            model=s.model, dtype=s.dtype, device=s.device, block_size=s.block_size, num_blocks=s.num_blocks,
            max_num_seqs=s.max_num_seqs, max_num_batched_tokens=s.max_num_batched_tokens,
            max_model_len=s.max_model_len, enable_prefix_caching=s.enable_prefix_caching,
            gpu_memory_utilization=s.gpu_memory_utilization, held_kv_ttl_s=s.kv_lease_s,
            backend=s.trtllm_backend, quant=s.trtllm_quant, kv_cache_dtype=s.trtllm_kv_cache_dtype,
            cache_transceiver=s.trtllm_cache_transceiver, tensor_parallel_size=s.trtllm_tensor_parallel_size,
            options_file=s.trtllm_options,
        ))
    if s.engine == "sim":
        from engines.sim.engine import SimEngine

        # "" = the shipped H100 / Llama-3.1-8B profile; a name or a JSON path (e.g. `tandem sim --save-profile`)
        return SimEngine(s.sim_profile or None, time_factor=s.sim_time_factor, worker_id=s.worker_id or "sim")
    from engines.native.config import EngineConfig
    from engines.native.engine import NativeEngine

    return NativeEngine(EngineConfig(
        model=s.model, dtype=s.dtype, device=s.device, block_size=s.block_size,
        num_blocks=s.num_blocks or None, max_num_seqs=s.max_num_seqs,
        max_num_batched_tokens=s.max_num_batched_tokens, max_model_len=s.max_model_len or None,
        enable_prefix_caching=s.enable_prefix_caching, held_kv_ttl_s=s.kv_lease_s,
        num_threads=s.num_threads or None,
    ))
