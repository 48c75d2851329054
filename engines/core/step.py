"""What one engine step is: the scheduler's output (the sequences scheduled, with the tokens each computes) and
what the runner hands back per sampling sequence. Plain data shared by the scheduler, the runners and the tier
plug-in; no logic beyond reading it."""

from dataclasses import dataclass, field

from engines.base.types import TokenLogprob
from engines.core.sequence import Sequence

# what a runner returns per sampling sequence, in `SchedulerOutput.sampling` order: one token, or for a sequence
# that verified proposed tokens, the tokens it accepted (the agreeing proposals and one more)
Sampled = tuple[int, TokenLogprob | None]
StepTokens = Sampled | list[Sampled]


@dataclass(frozen=True, slots=True)
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int  # tokens computed this step, from seq.num_computed_tokens on (proposed ones included)
    start: int  # seq.num_computed_tokens when scheduled
    spec_token_ids: tuple[int, ...] = ()  # proposed tokens verified after the last one; never in seq.token_ids

    @property
    def samples(self) -> bool:
        """True when this step reaches the sequence's last token, so a new token is sampled."""
        return self.start + self.num_new_tokens - len(self.spec_token_ids) == self.seq.num_tokens

    def input_ids(self) -> list[int]:
        """The token ids this step computes: the sequence's, then the proposed ones."""
        end = self.start + self.num_new_tokens - len(self.spec_token_ids)
        return self.seq.token_ids[self.start : end] + list(self.spec_token_ids)


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    num_blocks_used: int = 0  # KV blocks in use once this step's are allocated (what a timing model reads)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def sampling(self) -> list[ScheduledSeq]:
        """The scheduled sequences that sample a token this step, in schedule order."""
        return [s for s in self.scheduled if s.samples]
