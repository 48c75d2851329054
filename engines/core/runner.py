"""The Runner: what EngineCore needs from a backend — run one scheduled step, move KV blocks, say what it
is — and nothing of requests' lifecycles. native (PyTorch), sim (a timing model) and zero (free tokens) are
runners. No torch here."""

from dataclasses import dataclass
from typing import Protocol

from engines.base.requests import DTYPE_BYTES
from engines.base.types import KvExport, KvLayout
from engines.core.loads import KvLoad, KvSource, LoadDone
from engines.core.step import Sampled, SchedulerOutput, StepTokens
from engines.transfer import transports


@dataclass(frozen=True, slots=True)
class RunnerInfo:
    """What the core asks a runner once: the shape of its KV cache and of its vocabulary."""

    kv_layout: KvLayout
    num_blocks: int
    max_model_len: int  # computed once, here; workers report it, the gateway reads it from the router
    vocab_size: int
    eos_token_ids: tuple[int, ...] = ()
    kv_transport: str = transports.BYTES  # how other engines' KV reaches it (engines/transfer/transports.py)
    no_logits: str = ""  # the engine's name when it draws tokens without logits (sim, zero): shaping is refused
    can_constrain: bool = False  # it masks sampling to a request's grammar (StructuredSpec); else it refuses one
    can_speculate: bool = False  # it verifies ScheduledSeq.spec_token_ids (speculative decoding)


class PendingStep(Protocol):
    def wait(self) -> list[StepTokens]:
        """Block until the step is done; (token, logprob) per sampling sequence, in `out.sampling` order (a list
        of them for a sequence that verified proposed tokens: the ones it accepted)."""


class Runner(Protocol):
    info: RunnerInfo

    def launch(self, out: SchedulerOutput) -> PendingStep:
        """Start one step. Whatever a device can run asynchronously runs after this returns, so the core
        processes the previous step's outputs meanwhile (overlap); `wait()` collects the tokens."""

    def step_duration(self, out: SchedulerOutput) -> float:
        """The step's duration in virtual time (the cluster simulator's clock); 0 for runners that
        really run, whose time is the wall clock's."""

    def export_kv(
        self, block_ids: list[int], token_ids: tuple[int, ...], into: str = "", offset: int = 0
    ) -> KvExport | bytes:
        """The KV of `block_ids` (the first len(token_ids) tokens of a request): as bytes (`read_kv`); or written
        `into` the staging file at that path from `offset` on, in the KvExport byte order, returning the handle
        (a STAGING descriptor) that names it. InvalidRequestError for a runner whose KV leaves as bytes only."""

    def read_kv(self, block_ids: list[int], token_ids: tuple[int, ...]) -> KvExport:
        """The KV of `block_ids` as bytes: a bytes export's copy."""

    def import_kv(self, block_ids: list[int], kv: KvExport) -> None:
        """Write `kv` into `block_ids` (already checked against `info.kv_layout`): a KvExport load's copy."""

    def start_load(self, load: KvLoad) -> None:
        """Start filling `load.block_ids` from `load.source` (a KvExport, a transfer descriptor, a tier's Onboard)
        without blocking the step loop; raise InvalidRequestError at once for a source this runner cannot read
        (nothing started)."""

    def poll_loads(self) -> list[LoadDone]:
        """The loads that ended since the last poll (each reported once); never blocks."""

    def kv_source(self, handle: bytes) -> KvSource:
        """The load source a handle names (it has `token_ids`); InvalidRequestError for what it cannot read."""

    def describe_kv(self, req_id: str, block_ids: list[int], token_ids: tuple[int, ...]) -> bytes:
        """The handle by which another engine of this kind loads these held blocks itself; b"" for none."""

    def release_described(self, req_id: str) -> None:
        """The held blocks `describe_kv` named for `req_id` are freed: whatever exposed them ends."""


@dataclass(frozen=True, slots=True)
class Done:
    """A step that finished when it was launched (runners with nothing asynchronous to wait for)."""

    sampled: list[Sampled]

    def wait(self) -> list[Sampled]:
        return self.sampled


def zero_kv_export(layout: KvLayout, num_blocks: int, token_ids: tuple[int, ...]) -> KvExport:
    """Real-sized zero bytes, for runners that hold no KV: what a transfer of their blocks would move."""
    values = layout.num_layers * 2 * num_blocks * layout.block_size * layout.num_kv_heads * layout.head_dim
    return KvExport(layout, token_ids, num_blocks, bytes(values * DTYPE_BYTES[layout.dtype]))


def deterministic_token(candidate: int, banned: tuple[int, ...], vocab_size: int) -> int:
    """`candidate`, or the first id after it that is not banned (a stop token before min_tokens)."""
    while candidate in banned:
        candidate = (candidate + 1) % vocab_size
    return candidate
