"""On a CUDA device: the kernel checks at model shapes, and decode under CUDA graphs against eager."""
import pytest
import torch

from engines.native.kernels import checks

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
BIG = {"num_heads": 32, "num_kv_heads": 8, "head_dim": 128, "block_size": 16}


@pytest.mark.parametrize("kv_dtype", [None, torch.float8_e4m3fn])
def test_kernels_at_llama_8b_shapes_bf16(kv_dtype):
    results = [checks.check_decode("cuda", torch.bfloat16, kv_dtype, seq_lens=(1, 129, 1000), **BIG),
               checks.check_prefill("cuda", torch.bfloat16, kv_dtype, spans=((512, 512), (100, 700)), **BIG),
               checks.check_nvfp4_matmul("cuda", torch.bfloat16, 1, 4096, 4096)]
    assert all(r.ok for r in results), results


async def test_cuda_graph_decode_matches_eager(tiny_llama):
    from tests.unit.engines.helpers import greedy, run_batch, started

    prompts = [list(range(5, 5 + n)) for n in (3, 17, 40)]
    tokens = []
    for graphs in (False, True):
        engine = await started(tiny_llama, device="cuda", cuda_graphs=graphs, max_num_seqs=4)
        try:
            tokens.append(await run_batch(engine, prompts, greedy(16)))
        finally:
            await engine.shutdown()
    assert tokens[0] == tokens[1]
