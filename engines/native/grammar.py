"""Grammar-constrained sampling for the native engine, over llguidance: one matcher per constrained request, brought
up to date with the request's output tokens before each step (so a request continued elsewhere, after a prefill
worker's first token or a migration, replays them into a fresh matcher), and the step's masks computed together on
a worker thread while the model runs. Knows nothing of scheduling; never touches the logits itself."""
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import llguidance
import numpy as np
import torch

from engines.base.grammar import grammar_text

log = logging.getLogger(__name__)
@dataclass(slots=True, eq=False)
class _Entry:
    seq: object  # the core's Sequence: read, never written
    matcher: llguidance.LLMatcher
    num_consumed: int = 0  # output tokens fed to the matcher


@dataclass(slots=True)
class GrammarCounters:
    """What the masks cost, summed since start (the worker's metrics and the serving benchmark read them)."""

    num_masks: int = 0  # sampling rows masked (one per constrained token)
    mask_seconds: float = 0.0  # on the grammar thread: feeding the matchers and filling the step's masks
    # on the step thread (what decode latency pays): starting the step's masks (new matchers, new tokens read) and
    # waiting for them after the forward pass
    wait_seconds: float = 0.0


@dataclass(slots=True)
class MaskJob:
    """The masks of one step's sampling rows, being computed; `wait` gives [num_rows, vocab_size] bool (True:
    allowed) on `device`, None when no row is constrained."""

    future: Future
    device: str
    counters: GrammarCounters

    def wait(self) -> torch.Tensor:
        start = time.perf_counter()
        allowed = self.future.result()
        self.counters.wait_seconds += time.perf_counter() - start
        return allowed.to(self.device, non_blocking=True)


class Grammars:
    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_ids: tuple[int, ...], device: str = "cpu"):
        self.vocab_size, self.device = vocab_size, device
        # NOTE: a model without EOS ids (config and generation_config) leaves llguidance the tokenizer's own
        self.tokenizer = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size,
                                                eos_token=list(eos_token_ids) or None)
        self._executor = llguidance.LLExecutor(num_threads=1)  # NOTE: the forward pass has the other cores
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar")
        self._live: dict[str, _Entry] = {}
        self._compile = lru_cache(maxsize=256)(grammar_text)
        self._stop_only = np.zeros((vocab_size + 31) // 32, dtype=np.uint32)
        for eos in eos_token_ids:
            self._stop_only[eos // 32] |= np.uint32(1 << (eos % 32))
        self._stop_only = self._stop_only.view(np.int32)
        self.counters = GrammarCounters()

    @classmethod
    def maybe_load(cls, model_dir: str, vocab_size: int, eos_token_ids: tuple[int, ...],
                   device: str = "cpu") -> "Grammars | None":
        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            log.warning("%s has no tokenizer.json: structured outputs are refused", model_dir)
            return None
        try:
            return cls(path.read_text(), vocab_size, eos_token_ids, device)
        except ValueError as exc:  # NOTE: e.g. a tokenizer with no decoder llguidance knows; the model still serves
            log.warning("llguidance cannot read %s (%s): structured outputs are refused", path, exc)
            return None

    def start(self, seqs: list) -> MaskJob | None:
        """Begin the masks of one step's sampling sequences (in order); None when none is constrained."""
        start = time.perf_counter()
        self._forget_finished()
        rows = [(i, self._entry(seq)) for i, seq in enumerate(seqs) if seq.params.structured is not None]
        if not rows:
            return None
        todo = [(entry, i, seq_new_tokens(entry)) for i, entry in rows]  # NOTE: read here, on the step thread
        job = MaskJob(self._thread.submit(self._masks, todo, len(seqs)), self.device, self.counters)
        self.counters.wait_seconds += time.perf_counter() - start
        return job

    def _entry(self, seq) -> _Entry:
        entry = self._live.get(seq.req_id)
        if entry is None or entry.seq is not seq:
            matcher = llguidance.LLMatcher(self.tokenizer, self._compile(seq.params.structured))
            entry = self._live[seq.req_id] = _Entry(seq, matcher)
        return entry

    def _forget_finished(self) -> None:
        for req_id in [r for r, e in self._live.items() if e.seq.is_finished]:
            del self._live[req_id]

    def _masks(self, todo: list, num_rows: int) -> torch.Tensor:
        """On the grammar thread: feed each matcher its new tokens, then fill every row's bitmask in one call."""
        start = time.perf_counter()
        for entry, _, tokens in todo:
            # NOTE: a finished grammar takes no more tokens: what follows it (ignore_eos) is stop tokens alone
            if tokens and not entry.matcher.is_stopped() and not entry.matcher.consume_tokens(tokens):
                log.warning("request %s left its grammar: %s", entry.seq.req_id, entry.matcher.get_error())
            entry.num_consumed += len(tokens)
        bitmask = np.full((num_rows, (self.vocab_size + 31) // 32), -1, dtype=np.int32)
        self._executor.unsafe_compute_mask_ptr([(e.matcher, i) for e, i, _ in todo], bitmask.ctypes.data,
                                               bitmask.shape[1] * 4, num_rows)
        for entry, i, _ in todo:
            if entry.matcher.is_error() or entry.matcher.is_stopped():  # NOTE: stop tokens only, never run free
                bitmask[i] = self._stop_only
        allowed = unpack_bitmask(bitmask, self.vocab_size)
        self.counters.mask_seconds += time.perf_counter() - start
        self.counters.num_masks += len(todo)
        return allowed

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)


def seq_new_tokens(entry: _Entry) -> list[int]:
    seq = entry.seq
    return list(seq.token_ids[seq.num_prompt_tokens + entry.num_consumed:])


def unpack_bitmask(bitmask: np.ndarray, vocab_size: int) -> torch.Tensor:
    """[rows, words] int32 bitmask (bit j of word w: token 32w+j) -> [rows, vocab_size] bool."""
    bits = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")  # [rows, words * 32]
    return torch.from_numpy(bits[:, :vocab_size].astype(bool))
