"""The supervisor's decisions under a fake clock with fake children: restarts with doubling backoff, a crash loop
given up on with the child's name and log, bad settings never retried, a child that stays up forgiven."""

import pytest

from services.common.process import RestartPolicy
from tandem.supervisor import CrashLoopError, Supervisor, describe_exit
from tests.unit.services.router.helpers import FakeClock


class Children:
    def __init__(self, *names: str):
        self.codes: dict[str, int | None] = dict.fromkeys(names)
        self.started: list[str] = []

    def exit_code(self, name: str) -> int | None:
        return self.codes[name]

    def restart(self, name: str) -> None:
        self.codes[name] = None
        self.started.append(name)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(0.0)


def make(children: Children, clock: FakeClock) -> Supervisor:
    return Supervisor(
        lambda: list(children.codes),
        children.exit_code,
        children.restart,
        lambda name: f"{name}: boom\n",
        RestartPolicy(initial_backoff_s=0.5, max_backoff_s=4.0, max_restarts=3, window_s=60.0),
        clock,
    )


def test_backoff_doubles_up_to_its_cap():
    policy = RestartPolicy(initial_backoff_s=0.5, max_backoff_s=4.0)
    assert [policy.backoff_s(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 4.0, 4.0]


def test_a_dead_child_is_started_again_after_its_backoff_and_the_others_are_left_alone(clock):
    children = Children("router", "decode-0", "decode-1")
    supervisor = make(children, clock)
    children.codes["decode-0"] = -9
    supervisor.poll()
    assert children.started == []
    clock.advance(0.49)
    supervisor.poll()
    assert children.started == []
    clock.advance(0.01)
    supervisor.poll()
    assert children.started == ["decode-0"] and children.codes["decode-0"] is None
    children.codes["decode-0"] = 1  # dies again at once: the wait doubles
    clock.advance(1)
    supervisor.poll()
    clock.advance(0.99)
    supervisor.poll()
    assert children.started == ["decode-0"]
    clock.advance(0.01)
    supervisor.poll()
    assert children.started == ["decode-0", "decode-0"]
    assert supervisor.histories["decode-0"].num_restarts == 2


def test_a_crash_loop_is_given_up_naming_the_child_its_exit_and_its_log(clock):
    children = Children("gateway", "decode-0")
    supervisor = make(children, clock)
    for _ in range(3):
        children.codes["decode-0"] = 1
        supervisor.poll()
        clock.advance(5)
        supervisor.poll()
    children.codes["decode-0"] = -15
    with pytest.raises(CrashLoopError) as raised:
        supervisor.poll()
    message = str(raised.value)
    assert message.startswith("decode-0 is crash-looping: it exited 4 times within 60 s, the last with signal SIGTERM")
    assert message.endswith("its log ends:\ndecode-0: boom")


def test_exits_spread_out_in_time_are_forgiven(clock):
    children = Children("decode-0")
    supervisor = make(children, clock)
    for _ in range(10):
        children.codes["decode-0"] = -9
        supervisor.poll()
        clock.advance(61)
        supervisor.poll()
    assert len(children.started) == 10


def test_bad_settings_are_never_retried(clock):
    children = Children("router")
    children.codes["router"] = 2
    with pytest.raises(CrashLoopError, match=r"^router exited with code 2 \(bad settings; a restart would not help\)"):
        make(children, clock).poll()


def test_exit_descriptions():
    assert (describe_exit(0), describe_exit(1), describe_exit(-9), describe_exit(-99)) == (
        "code 0",
        "code 1",
        "signal SIGKILL",
        "signal 99",
    )
