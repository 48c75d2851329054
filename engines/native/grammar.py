"""Grammar-constrained sampling for the native engine, over llguidance: one matcher per constrained request, built
(and its first mask computed, which builds its lexer) on a grammar thread while the request's first forward pass
runs; then each step's masks are filled on the step thread after the forward pass is enqueued (beside it on a GPU),
a few µs per row, with no thread hand-off per token. A request continued elsewhere (after a prefill worker's first
token, or a migration) replays its output tokens into a fresh matcher. Knows nothing of scheduling; never touches
the logits itself."""

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import llguidance
import numpy as np
import torch

from engines.base.errors import InvalidRequestError
from engines.base.grammar import grammar_text

log = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class _Entry:
    seq: object  # the core's Sequence: read, never written
    ready: Future  # of the matcher, built on the grammar thread with its first tokens consumed and first mask filled
    matcher: llguidance.LLMatcher | None = None  # the step thread's once `ready` is done; never touched before
    num_consumed: int = 0  # output tokens fed to the matcher
    first_mask: np.ndarray | None = None  # [words] int32: the mask after `num_consumed` tokens, from the grammar thread


@dataclass(slots=True)
class GrammarCounters:
    """What the masks cost, summed since start (the worker's metrics and the serving benchmark read them)."""

    num_masks: int = 0  # sampling rows masked (one per constrained token)
    mask_seconds: float = 0.0  # on the step thread: feeding the matchers and filling the masks
    build_seconds: float = 0.0  # on the grammar thread: building the matchers, each with its first mask
    # on the step thread (what decode latency pays): starting the step's masks, then filling them after the
    # forward pass (waiting for a new request's matcher included)
    wait_seconds: float = 0.0


@dataclass(slots=True)
class MaskJob:
    """The masks of one step's sampling rows; `wait` fills them and gives [num_rows, vocab_size] bool (True:
    allowed) on the device."""

    grammars: "Grammars"
    rows: list[tuple[int, _Entry]]  # (row, its request's entry)
    num_rows: int

    def wait(self) -> torch.Tensor:
        return self.grammars.fill(self.rows, self.num_rows)


class Grammars:
    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_ids: tuple[int, ...], device: str = "cpu"):
        self.vocab_size, self.device = vocab_size, device
        self.num_words = (vocab_size + 31) // 32
        # NOTE: a model without EOS ids (config and generation_config) leaves llguidance the tokenizer's own
        self.tokenizer = llguidance.LLTokenizer(
            tokenizer_json, n_vocab=vocab_size, eos_token=list(eos_token_ids) or None
        )
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar")
        self._live: dict[str, _Entry] = {}
        self._compile = lru_cache(maxsize=256)(grammar_text)
        self._stop_only = np.zeros(self.num_words, dtype=np.uint32)
        for eos in eos_token_ids:
            self._stop_only[eos // 32] |= np.uint32(1 << (eos % 32))
        self._stop_only = self._stop_only.view(np.int32)
        self.counters = GrammarCounters()

    @classmethod
    def maybe_load(
        cls, model_dir: str, vocab_size: int, eos_token_ids: tuple[int, ...], device: str = "cpu"
    ) -> "Grammars | None":
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
        """Before the forward pass: one step's sampling sequences (in order); a new request's matcher starts
        building on the grammar thread. None when none is constrained."""
        start = time.perf_counter()
        self._forget_finished()
        rows = [(i, self._entry(seq)) for i, seq in enumerate(seqs) if seq.params.structured is not None]
        self.counters.wait_seconds += time.perf_counter() - start
        return MaskJob(self, rows, len(seqs)) if rows else None

    def fill(self, rows: list[tuple[int, _Entry]], num_rows: int) -> torch.Tensor:
        """After the forward pass is enqueued, on the step thread: feed each matcher its new tokens and fill its
        row of the step's bitmask (unconstrained rows allow everything)."""
        start = time.perf_counter()
        bitmask = np.full((num_rows, self.num_words), -1, dtype=np.int32)
        for i, entry in rows:
            self._fill_row(entry, bitmask, i)
        allowed = unpack_bitmask(bitmask, self.vocab_size).to(self.device, non_blocking=True)
        elapsed = time.perf_counter() - start
        self.counters.wait_seconds += elapsed
        self.counters.mask_seconds += elapsed
        self.counters.num_masks += len(rows)
        return allowed

    def _fill_row(self, entry: _Entry, bitmask: np.ndarray, i: int) -> None:
        if entry.matcher is None:  # NOTE: its first step: the grammar thread built it during the forward pass
            entry.matcher, entry.num_consumed, entry.first_mask = entry.ready.result()
        matcher, tokens = entry.matcher, seq_new_tokens(entry)
        if matcher is None:  # NOTE: it could not be built (logged): this request stops, the others go on
            bitmask[i] = self._stop_only
            return
        # NOTE: a finished grammar takes no more tokens: what follows it (ignore_eos) is stop tokens alone
        if tokens and not matcher.is_stopped() and not matcher.consume_tokens(tokens):
            log.warning("request %s left its grammar: %s", entry.seq.req_id, matcher.get_error())
        entry.num_consumed += len(tokens)
        if matcher.is_error() or matcher.is_stopped():  # NOTE: stop tokens only, never run free
            bitmask[i] = self._stop_only
        elif entry.first_mask is not None and not tokens:
            bitmask[i] = entry.first_mask
        else:
            matcher.unsafe_compute_mask_ptr(bitmask[i].ctypes.data, self.num_words * 4)
        entry.first_mask = None

    def _entry(self, seq) -> _Entry:
        entry = self._live.get(seq.req_id)
        if entry is None or entry.seq is not seq:
            tokens = list(seq.token_ids[seq.num_prompt_tokens :])  # NOTE: read here, on the step thread
            ready = self._thread.submit(self._build, seq.params.structured, tokens, seq.req_id)
            entry = self._live[seq.req_id] = _Entry(seq, ready)
        return entry

    def _build(
        self, spec, tokens: list[int], req_id: str
    ) -> tuple[llguidance.LLMatcher | None, int, np.ndarray | None]:
        """On the grammar thread: the matcher, fed the tokens already generated, and its next mask (no matcher when
        the grammar does not compile: the gateway checks it first, so only a caller that skips it gets here)."""
        start = time.perf_counter()
        try:
            matcher = llguidance.LLMatcher(self.tokenizer, self._compile(spec))
        except (InvalidRequestError, ValueError, TypeError) as exc:  # NOTE: a bad grammar ends its own request only
            log.warning("request %s: its grammar does not compile: %s", req_id, exc)
            return None, len(tokens), None
        if tokens and not matcher.consume_tokens(tokens):
            log.warning("request %s left its grammar: %s", req_id, matcher.get_error())
        mask = None
        if not (matcher.is_error() or matcher.is_stopped()):
            mask = np.empty(self.num_words, dtype=np.int32)
            matcher.unsafe_compute_mask_ptr(mask.ctypes.data, self.num_words * 4)
        self.counters.build_seconds += time.perf_counter() - start
        return matcher, len(tokens), mask

    def _forget_finished(self) -> None:
        for req_id in [r for r, e in self._live.items() if e.seq.is_finished]:
            del self._live[req_id]

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)


def seq_new_tokens(entry: _Entry) -> list[int]:
    seq = entry.seq
    return list(seq.token_ids[seq.num_prompt_tokens + entry.num_consumed :])


def unpack_bitmask(bitmask: np.ndarray, vocab_size: int) -> torch.Tensor:
    """[rows, words] int32 bitmask (bit j of word w: token 32w+j) -> [rows, vocab_size] bool."""
    bits = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")  # [rows, words * 32]
    return torch.from_numpy(bits[:, :vocab_size].astype(bool))
