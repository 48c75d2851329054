"""The benchmark's workload: how many requests of what length, and their deterministic random prompts
(token ids drawn from the tokenizer's ordinary vocabulary, never a special token)."""

import json
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True, slots=True)
class Workload:
    name: str  # "concurrent" | "batch1"
    num_requests: int
    isl: int  # prompt tokens per request
    osl: int  # output tokens per request, exactly (EOS is ignored)
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.num_requests, self.isl, self.osl) < 1:
            raise ValueError(f"num_requests, isl and osl must be >= 1, got {self}")


def vocab_size(model_dir: Path) -> int:
    """Rows of the embedding that a tokenizer can produce: config.json's, capped by the tokenizer's."""
    size = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    tok_path = Path(model_dir) / "tokenizer.json"
    if tok_path.is_file():
        from tokenizers import Tokenizer

        size = min(size, Tokenizer.from_file(str(tok_path)).get_vocab_size(with_added_tokens=True))
    return size


def special_token_ids(model_dir: Path) -> set[int]:
    """BOS/EOS/PAD ids from the configs plus every token the tokenizer marks special."""
    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        path = Path(model_dir) / name
        if path.is_file():
            cfg = json.loads(path.read_text())
            for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
                ids.update(_as_ids(cfg.get(key)))
    tok_path = Path(model_dir) / "tokenizer.json"
    if tok_path.is_file():
        added = json.loads(tok_path.read_text()).get("added_tokens") or []
        ids.update(t["id"] for t in added if t.get("special"))
    return ids


def make_prompts(workload: Workload, num_ids: int, excluded: set[int]) -> list[list[int]]:
    """`num_requests` prompts of exactly `isl` ids in [0, num_ids) minus `excluded`, fixed by `seed`."""
    allowed = torch.tensor(sorted(set(range(num_ids)) - excluded), dtype=torch.long)
    if allowed.numel() == 0:
        raise ValueError("no ordinary token ids to build prompts from")
    gen = torch.Generator().manual_seed(workload.seed)
    picks = torch.randint(0, allowed.numel(), (workload.num_requests, workload.isl), generator=gen)
    return allowed[picks].tolist()


def prompts_for(model_dir: Path, workload: Workload) -> list[list[int]]:
    return make_prompts(workload, vocab_size(model_dir), special_token_ids(model_dir))


def _as_ids(value) -> list[int]:
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int)]
