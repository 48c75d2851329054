"""The engine loop: owns one EngineCore, applies the client's commands between steps, steps while there is
work, and sends ONE StepOutputs message per step with every request's new tokens, the stats and the KV events.

With overlap, step N is launched before step N-1's outputs are sent, so building and sending them runs while
the device computes (nothing in N's launch depends on how N-1's outputs are sent; N-1 is committed first).
The same loop runs in the engine process and, for tests and in-process benchmarks, on a thread.
"""

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from engines.base.errors import EngineError
from engines.base.types import FinishReason, RequestOutput
from engines.core.engine_core import EngineCore
from engines.core.messages import Abort, Add, Call, Failed, Ready, Reply, StepOutputs, Stop
from engines.core.runner import PendingStep
from engines.core.step import SchedulerOutput

log = logging.getLogger(__name__)
IDLE_WAIT_S = 0.05  # how long an idle loop waits for a command before it checks held KV leases again
LOAD_WAIT_S = 0.001  # how long a loop with only KV loads in flight waits for a command before it polls them
CALLS = ("export_kv", "release_kv", "reset_prefix_cache")  # what a Call may name


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """How to build an engine where it will run: `builder` ("module:function") is imported there and called
    with `config`; it returns an EngineCore. Picklable, so an engine process can be handed one."""

    builder: str
    config: Any

    def build(self) -> EngineCore:
        module, name = self.builder.split(":")
        return getattr(importlib.import_module(module), name)(self.config)


class EngineSide(Protocol):
    def recv(self, timeout: float | None) -> list:
        """Commands that arrived, waiting up to `timeout` (None: do not wait) for the first."""

    def send(self, message) -> None: ...


def serve(spec: EngineSpec, channel: EngineSide, overlap: bool) -> None:
    """Build the engine, say Ready (or Failed), then loop until Stop."""
    core = build(spec, channel)
    if core is not None:
        EngineLoop(core, channel, overlap).run()


def build(spec: EngineSpec, channel: EngineSide) -> EngineCore | None:
    """The engine, announced with Ready; None (and Failed sent, typed) when it cannot be built."""
    try:
        core = spec.build()
    except Exception as exc:  # handed to the client's constructor
        channel.send(Failed(exc if isinstance(exc, (EngineError, ValueError)) else EngineError(repr(exc))))
        return None
    channel.send(Ready(core.info, core.stats()))
    return core


class EngineLoop:
    def __init__(self, core: EngineCore, channel: EngineSide, overlap: bool = False):
        self.core, self.channel, self.overlap = core, channel, overlap
        self.unsent: list[RequestOutput] = []
        self.is_dirty = False  # something changed since the last message (a step, a command)
        self.is_stopping = False

    def run(self) -> None:
        while not self.is_stopping:
            try:
                self.iterate()
            except (EOFError, OSError):  # the client is gone: nobody left to serve
                raise
            except Exception:  # NOTE: a bug must not silently kill the loop and hang every stream
                log.exception("engine loop crashed; failing live requests")
                self.unsent += self._fail_all("engine step crashed")
                self._publish()

    def iterate(self) -> None:
        idle = not (self.core.has_work or self.unsent)
        for command in self.channel.recv((LOAD_WAIT_S if self.core.has_loads else IDLE_WAIT_S) if idle else None):
            self._apply(command)
        if self.core.poll_loads():
            self.is_dirty = True
        if self.core.failed_loads:
            self.unsent += self.core.failed_loads
            self.core.failed_loads = []
        out = self.core.schedule()
        pending = self._launch(out) if out is not None else None
        if self.overlap or pending is None:
            self._publish(is_idle=pending is None)  # step N-1's outputs, while step N runs
        if out is not None and pending is not None:
            self.unsent += self._collect(out, pending)
            if not self.overlap:
                self._publish()
        if self.core.expire_held(self.core.clock()):
            self.is_dirty = True

    # -- internals ---------------------------------------------------------------------------
    def _launch(self, out: SchedulerOutput) -> PendingStep | Exception:
        self.is_dirty = True
        try:
            return self.core.launch(out)
        except Exception as exc:
            return exc

    def _collect(self, out: SchedulerOutput, pending: PendingStep | Exception) -> list[RequestOutput]:
        try:
            if isinstance(pending, Exception):
                raise pending
            sampled = pending.wait()
        except Exception as exc:  # NOTE: a failed step fails its requests, never the engine
            log.warning("engine step failed: %r", exc)
            return self.core.fail(out, exc)
        return self.core.commit(out, sampled)

    def _publish(self, is_idle: bool = True) -> None:
        """One message: the outputs not yet sent, the stats, the KV events. With a step in flight, only when
        there are outputs or events: its own message follows with fresh stats."""
        events = self.core.drain_kv_events()
        if not (self.unsent or events or (self.is_dirty and is_idle)):
            return
        self.channel.send(StepOutputs(self.unsent, self.core.stats(), events))
        self.unsent, self.is_dirty = [], False

    def _apply(self, command) -> None:
        self.is_dirty = True
        if isinstance(command, Add):
            self._add(command)
        elif isinstance(command, Abort):
            if (out := self.core.abort(command.req_id)) is not None:
                self.unsent.append(out)
        elif isinstance(command, Call):
            reply = self._call(command)
            self._publish()  # NOTE: what the call changed (a CLEARED event) reaches the client before its reply
            self.channel.send(reply)
        elif isinstance(command, Stop):
            self.is_stopping = True
            self.unsent += [
                RequestOutput(o.req_id, o.new_token_ids, o.logprobs, FinishReason.ABORT)
                for o in map(self.core.abort, list(self.core.seqs))
                if o is not None
            ]
            self._publish()

    def _add(self, command: Add) -> None:
        try:
            self.core.add(command.request)
        except EngineError as exc:
            self.unsent.append(
                RequestOutput(command.request.req_id, (), finish_reason=FinishReason.ERROR, error=str(exc))
            )

    def _call(self, call: Call) -> Reply:
        if call.name not in CALLS:
            return Reply(call.call_id, error=EngineError(f"unknown engine call {call.name!r}"))
        method: Callable = getattr(self.core, call.name)
        try:
            args = call.arg if isinstance(call.arg, tuple) else () if call.arg is None else (call.arg,)
            return Reply(call.call_id, method(*args))
        except EngineError as exc:
            return Reply(call.call_id, error=exc)

    def _fail_all(self, message: str) -> list[RequestOutput]:
        outs = [o for req_id in list(self.core.seqs) if (o := self.core.abort(req_id)) is not None]
        return [RequestOutput(o.req_id, o.new_token_ids, o.logprobs, FinishReason.ERROR, error=message) for o in outs]
