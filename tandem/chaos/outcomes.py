"""What happened to each request of a chaos scenario, and the scenario's verdict. A request is completed (every
token, in order, ended with [DONE]), failed cleanly (an OpenAI-style error, with Retry-After where it is 429/503),
left (its client hung up on purpose), or it counts against the scenario: lost (no answer, a hang past the
deadline, a cut connection), corrupted (an answer with a gap, a repeat or the wrong length), or unclean (an
answer no client can act on: a 500, a 503 without Retry-After).

Pure: records in, counts out.
"""

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from tandem.chaos.client import Record

COMPLETED, FAILED_CLEANLY, LEFT, LOST, CORRUPTED, UNCLEAN = (
    "completed",
    "failed_cleanly",
    "left",
    "lost",
    "corrupted",
    "unclean",
)
BAD = (LOST, CORRUPTED, UNCLEAN)
CLEAN_STATUSES = frozenset({400, 404, 413, 429, 503, 504})  # what a client is told to fix or to retry
RETRY_STATUSES = frozenset({429, 503})


def classify(rec: Record, max_tokens: int, expected_text: str | None = None) -> str:
    if rec.has_left:
        return LEFT
    if rec.timed_out or rec.transport_error or not rec.has_ended:
        return LOST
    if rec.status == 200 and rec.error is None:
        if not rec.is_done or rec.finish_reason is None:
            return LOST  # ended without saying so: the client cannot tell it from a cut
        is_whole = rec.num_tokens == max_tokens and (expected_text is None or rec.text == expected_text)
        return COMPLETED if is_whole else CORRUPTED
    return FAILED_CLEANLY if is_clean_error(rec) else UNCLEAN


def is_clean_error(rec: Record) -> bool:
    err = rec.error
    if not (isinstance(err, dict) and err.get("message") and err.get("type")):
        return False
    status = rec.status if rec.status != 200 else _status_of(err)  # an error event mid-stream names no status
    return status in CLEAN_STATUSES and (rec.status == 200 or status not in RETRY_STATUSES or bool(rec.retry_after))


def _status_of(err: dict) -> int:
    return {
        "service_unavailable_error": 503,
        "rate_limit_error": 429,
        "timeout_error": 504,
        "invalid_request_error": 400,
    }.get(err.get("type", ""), 500)


def recovery_s(outcomes: Iterable[tuple[Record, str]], since_s: float) -> float:
    """How long after `since_s` new requests kept failing: from `since_s` to the start of the last request started
    after it that did not complete (0 when none failed). Requests whose clients left on purpose do not count."""
    failed = [r.start_s for r, outcome in outcomes if r.start_s >= since_s and outcome not in (COMPLETED, LEFT)]
    return max(failed) - since_s if failed else 0.0


def first_token_after_s(records: Iterable[Record], since_s: float) -> float:
    """From `since_s` to the first token of the earliest-starting request started then or later that completed its
    stream: how long a new client waited to be served. NaN when none was."""
    firsts = [
        r.first_token_s for r in records if r.start_s >= since_s and r.status == 200 and r.error is None and r.is_done
    ]
    return min(firsts) - since_s if firsts else math.nan


def max_in_flight(records: Iterable[Record]) -> int:
    edges = sorted([(r.start_s, 1) for r in records] + [(r.end_s, -1) for r in records], key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, step in edges:
        level += step
        peak = max(peak, level)
    return peak


@dataclass(slots=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass(slots=True)
class ScenarioResult:
    name: str
    goal: str
    duration_s: float
    counts: dict[str, int]
    statuses: dict[str, int]
    migrated: int
    recovery_s: float  # new requests failed for this long after the fault (0: none did)
    first_token_after_s: float  # a new request's wait for its first token, from the fault
    max_in_flight: int
    checks: list[Check] = field(default_factory=list)
    facts: dict[str, float | str] = field(default_factory=dict)  # what the scenario measured beyond the counts

    @property
    def sent(self) -> int:
        return sum(self.counts.values())

    @property
    def passed(self) -> bool:
        return not any(self.counts.get(k, 0) for k in BAD) and all(c.ok for c in self.checks)

    def to_json(self) -> dict:
        return {**asdict(self), "sent": self.sent, "passed": self.passed}


def summarize(
    name: str, goal: str, outcomes: list[tuple[Record, str]], duration_s: float, migrated: int, since_s: float
) -> ScenarioResult:
    records = [r for r, _ in outcomes]
    counts = Counter(o for _, o in outcomes)
    statuses = Counter(str(r.status) if r.status else "none" for r in records)
    return ScenarioResult(
        name,
        goal,
        duration_s,
        {k: counts.get(k, 0) for k in (COMPLETED, FAILED_CLEANLY, LEFT, *BAD)},
        dict(sorted(statuses.items())),
        migrated,
        recovery_s(outcomes, since_s),
        first_token_after_s(records, since_s),
        max_in_flight(records),
    )
