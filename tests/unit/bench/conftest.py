"""Fixtures for the bench tests: a tiny random Llama checkpoint with a tiny tokenizer, and a fake
engine that speaks the native engine's async API."""

import asyncio
from pathlib import Path

import pytest

from engines.base.types import EngineRequest, FinishReason, RequestOutput

TINY_CONFIG = dict(
    vocab_size=256,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    bos_token_id=1,
    eos_token_id=2,
)
TOKENIZER_VOCAB = 200  # fewer ids than the embedding rows, as real checkpoints pad their vocab
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2


def make_tiny_llama(out: Path, tie_word_embeddings: bool) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**TINY_CONFIG, tie_word_embeddings=tie_word_embeddings)
    LlamaForCausalLM(config).save_pretrained(out)
    write_tokenizer(out)
    return out


def write_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"w{i}": i for i in range(len(SPECIAL_TOKENS), TOKENIZER_VOCAB)})
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer.save(str(out / "tokenizer.json"))


@pytest.fixture(scope="session")
def bench_llama(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("bench-llama"), tie_word_embeddings=False)


@pytest.fixture(scope="session")
def bench_llama_tied(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("bench-llama-tied"), tie_word_embeddings=True)


class FakeEngine:
    """Emits `max_tokens` tokens per request in deltas of `chunks` tokens (cycled), like the real engine's API."""

    def __init__(self, chunks=(1,), short_by: int = 0, error: str | None = None):
        self.chunks, self.short_by, self.error = chunks, short_by, error
        self.requests: list[EngineRequest] = []
        self.is_started = False

    async def start(self) -> None:
        self.is_started = True

    async def shutdown(self) -> None:
        self.is_started = False

    def add_request(self, request: EngineRequest):
        assert self.is_started, "add_request before start"
        self.requests.append(request)
        return self._stream(request)

    async def _stream(self, request: EngineRequest):
        if self.error is not None:
            yield RequestOutput(request.req_id, (7,), finish_reason=FinishReason.ERROR, error=self.error)
            return
        remaining, i = request.params.max_tokens - self.short_by, 0
        while remaining > 0:
            await asyncio.sleep(0.001)
            n = min(self.chunks[i % len(self.chunks)], remaining)
            remaining, i = remaining - n, i + 1
            done = FinishReason.LENGTH if remaining == 0 else None
            yield RequestOutput(request.req_id, tuple(range(n)), finish_reason=done)


@pytest.fixture
def fast_roofline(monkeypatch):
    """GEMM timing in milliseconds instead of seconds: the tests check accounting, not the machine."""
    from tandem.bench import roofline

    monkeypatch.setattr(roofline, "_MIN_ROUND_S", 0.001)
    monkeypatch.setattr(roofline, "_ROTATE_BYTES", 1)
    monkeypatch.setattr(roofline, "_NUM_ROUNDS", 1)
