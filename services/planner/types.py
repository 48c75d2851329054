"""The planner's domain types: what it observes each tick, the load it predicts, the replica changes it decides.
Frozen dataclasses with no transport, so the simulator, the service and the tests build them directly."""

from collections.abc import Mapping
from dataclasses import dataclass, field

from services.router.types import WorkerRole

ROLES = (WorkerRole.PREFILL, WorkerRole.DECODE)


class PlannerError(Exception):
    """Base of the planner's own errors; `grpc_status` names the status code (mapped in services/common)."""

    grpc_status = "INTERNAL"


class PlannerConfigError(PlannerError, ValueError):
    """A planner constant out of its range (the settings turn it into a SettingsError naming the variable)."""


class ConnectorError(PlannerError):
    """A connector could not read or change replicas (the API refused, a command failed, a timeout)."""

    grpc_status = "UNAVAILABLE"

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status  # the API's HTTP status, when there was one


@dataclass(frozen=True, slots=True)
class WorkerSample:
    """One worker's load as its last report said (the router's view, or a scrape)."""

    worker_id: str
    role: WorkerRole
    num_waiting: int = 0
    num_running: int = 0
    num_blocks_used: int = 0
    num_blocks_total: int = 0
    # cumulative counters (None: the worker does not report them): seconds spent stepping, steps, tokens generated
    busy_s: float | None = None
    num_steps: int | None = None
    num_generated_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """One finished request as the gateway saw it: its uncached prompt tokens, its own latencies, and where its
    first token came from (the route decision the gateway acted on)."""

    num_new_prompt_tokens: int
    ttft_s: float
    itl_s: float | None = None  # mean time between its tokens; None with a single token
    first_token_role: WorkerRole | None = None  # the pool whose worker computed its first token; None: not known
    is_overflow: bool = False  # sent to a decode worker to prefill because every prefill worker was queueing
    arrival_s: float | None = None  # when it arrived (the planner's clock); None: not known


@dataclass(frozen=True, slots=True)
class Replicas:
    """A role's replicas as the connector sees them: serving, asked for but not serving yet, leaving."""

    ready: int = 0
    starting: int = 0
    draining: int = 0
    is_held: bool = False  # someone else changed the count by hand: the planner leaves this role alone for now

    @property
    def desired(self) -> int:
        """The count the planner is paying for and will have: ready plus starting."""
        return self.ready + self.starting


@dataclass(frozen=True, slots=True)
class Observation:
    """What happened over the last `window_s` seconds. A None figure is missing (its source failed)."""

    window_s: float
    num_requests: int | None  # arrivals in the window
    mean_isl: float | None = None  # of those arrivals (None when there were none)
    mean_osl: float | None = None  # of the requests that finished in the window
    num_output_tokens: int | None = None  # generated in the window (every worker); preferred over mean_osl
    ttft_s: float | None = None  # observed TTFT quantile (the SLO's percentile); None: not observed
    itl_s: float | None = None  # observed inter-token latency quantile
    attainment: Mapping[str, float] = field(default_factory=dict)  # "ttft"/"itl": share within the SLO (reported)
    finished: tuple[RequestOutcome, ...] | None = None  # requests finished in the window; None: not observed
    workers: tuple[WorkerSample, ...] = ()
    replicas: Mapping[WorkerRole, Replicas] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Load:
    """Traffic over an interval: arrivals per second and mean prompt / output tokens."""

    request_rate: float
    isl: float
    osl: float


@dataclass(frozen=True, slots=True)
class Decision:
    role: WorkerRole
    current: int
    target: int
    reason: str


@dataclass(frozen=True, slots=True)
class TickResult:
    """One tick's outcome: the replica changes to make, and what the shell reports about them."""

    decisions: tuple[Decision, ...] = ()
    targets: Mapping[WorkerRole, int] = field(default_factory=dict)
    predicted: Load | None = None  # set on ticks that ran the adjustment loop
    budgets: Mapping[WorkerRole, float] = field(default_factory=dict)  # highest worker latency / SLO, per role
    warnings: tuple[str, ...] = ()
