"""One request's way across workers: the tokens the client has been given, the workers that failed it, and whether
it may go on elsewhere. Before its first token a failed worker is simply routed around; after it, the request
migrates: another worker continues from the prompt plus those tokens (the engines key seeded sampling on the
token's index, so it samples what the first one would have). When no live worker is left but those that failed it,
it may go back to them once: a dropped connection must not lose a request where the pool has one worker.

Pure: no I/O; the pipeline asks and does.
"""

from dataclasses import dataclass, field

MAX_ROUTE_ATTEMPTS = 3  # workers tried for one request when they fail before its first token


@dataclass(slots=True)
class Journey:
    max_migrations: int  # 0: a request whose worker fails mid-stream ends with the error
    output_token_ids: list[int] = field(default_factory=list)  # given to the client, in order
    excluded: list[str] = field(default_factory=list)  # workers that failed this request (until readmitted)
    num_failures: int = 0
    num_migrations: int = 0
    was_readmitted: bool = False

    def record(self, token_ids: tuple[int, ...]) -> None:
        self.output_token_ids.extend(token_ids)

    @property
    def is_started(self) -> bool:
        return bool(self.output_token_ids)

    def may_continue(self, failed_worker_id: str) -> bool:
        """After `failed_worker_id` failed the request: may another worker take it? Counts a migration if so."""
        self.num_failures += 1
        if failed_worker_id not in self.excluded:
            self.excluded.append(failed_worker_id)
        if not self.is_started:
            return self.num_failures < MAX_ROUTE_ATTEMPTS
        if self.num_migrations >= self.max_migrations:
            return False
        self.num_migrations += 1
        return True

    def readmit(self) -> bool:
        """The router has no live worker for it outside `excluded`: whether it may go back to those (once a
        request; the attempt and migration limits still bound it)."""
        if not self.excluded or self.was_readmitted:
            return False
        self.was_readmitted = True
        self.excluded.clear()
        return True

    def route_tokens(self, prompt: list[int]) -> list[int]:
        """What the next worker must hold KV for: the prompt, and after a migration the tokens so far too."""
        return [*prompt, *self.output_token_ids] if self.is_started else prompt
