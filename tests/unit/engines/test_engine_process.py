"""The engine loop and its process: one batched message per step, aborts, a killed engine process failing its
live streams at once, and the message encoding the process channel uses."""

import asyncio
import os
import signal

import pytest

from engines.base import EngineDiedError, EngineRequest, FinishReason, SamplingParams
from engines.core.client import EngineClient
from engines.core.loop import EngineLoop
from engines.core.messages import Abort, Add, StepOutputs, decode, encode
from engines.sim import SimOptions, sim_spec
from engines.zero import zero_spec
from engines.zero.runner import ZeroSpec
from engines.zero.runner import build_core as zero_core


class RecordingChannel:
    """The engine's side of a channel: commands handed in by the test, every message kept."""

    def __init__(self, commands: list):
        self.commands, self.sent = commands, []

    def recv(self, timeout):
        commands, self.commands = self.commands, []
        return commands

    def send(self, message) -> None:
        self.sent.append(message)


def params(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True)


@pytest.mark.parametrize("overlap", [False, True])
def test_each_step_sends_one_message_with_every_requests_tokens(tmp_path, overlap):
    core = zero_core(ZeroSpec(str(tmp_path)))
    adds = [Add(EngineRequest(f"r{i}", (1, 2, 3 + i), params(4))) for i in range(3)]
    channel = RecordingChannel(adds)
    loop = EngineLoop(core, channel, overlap)
    for _ in range(6):
        loop.iterate()
    steps = [m for m in channel.sent if isinstance(m, StepOutputs)]
    # four steps (prefill + first token, then three decodes), one message each, every request in each
    assert [sorted(o.req_id for o in m.outputs) for m in steps] == [["r0", "r1", "r2"]] * 4
    assert [[len(o.new_token_ids) for o in m.outputs] for m in steps] == [[1, 1, 1]] * 4
    assert all(o.finish_reason is FinishReason.LENGTH for o in steps[-1].outputs)
    assert steps[-1].stats.num_generated_tokens == 12 and steps[-1].stats.num_running == 0


def test_an_abort_between_steps_ends_the_request_in_the_next_message(tmp_path):
    core = zero_core(ZeroSpec(str(tmp_path)))
    channel = RecordingChannel([Add(EngineRequest("a", (1, 2, 3), params(100)))])
    loop = EngineLoop(core, channel)
    loop.iterate()
    channel.commands = [Abort("a")]
    loop.iterate()
    (last,) = channel.sent[-1].outputs
    assert last.finish_reason is FinishReason.ABORT and core.stats().num_blocks_used == 0


def test_messages_survive_the_encoding():
    from engines.base.types import EngineStats, KvExport, KvLayout, RequestOutput, TokenLogprob
    from engines.core.messages import Failed, Reply

    kv = KvExport(KvLayout(1, 1, 1, "float32", 4), (5, 6), 1, bytes(32))
    request = EngineRequest(
        "r",
        (1, 2),
        SamplingParams(max_tokens=3, seed=7, min_tokens=1, stop_token_ids=(9,)),
        kv=kv,
        output_token_ids=(4,),
    )
    out = RequestOutput(
        "r", (7,), (TokenLogprob(7, -0.5, ((7, -0.5), (8, -1.0))),), FinishReason.PREFILLED, 2, 1, None, 0.25, b"x"
    )
    step = StepOutputs([out], EngineStats(*range(13)), [])
    handle = EngineRequest("h", (1, 2), kv=b"opaque")  # NOTE: the field's other kind, a handle
    for message in (Add(request), Add(handle), step, Reply(3, kv), Failed(EngineDiedError("gone"))):
        again = decode(encode(message))
        assert type(again) is type(message)
        if isinstance(message, Failed):
            assert type(again.error) is EngineDiedError and str(again.error) == "gone"
        else:
            assert again == message


async def test_abort_through_the_engine_process(tmp_path):
    engine = EngineClient(zero_spec(str(tmp_path)), process=True)
    await engine.start()
    try:
        stream = engine.add_request(EngineRequest("a", (1, 2, 3), params(10**6)))
        first = await anext(stream)
        await engine.abort("a")
        rest = [out async for out in stream]
        assert first.new_token_ids and rest[-1].finish_reason is FinishReason.ABORT
        tokens, _ = await _collect(engine, EngineRequest("b", (1, 2, 3), params(5)))
        assert tokens == [4, 5, 6, 7, 8]  # the zero runner's walk, after the prompt's last token
    finally:
        await engine.shutdown()
    assert not engine.channel.process.is_alive()


async def test_a_killed_engine_process_fails_its_streams_and_serves_no_more():
    engine = EngineClient(sim_spec(SimOptions(time_factor=1.0)), process=True)
    await engine.start()
    try:
        stream = engine.add_request(EngineRequest("a", tuple(range(64)), params(10**5)))
        await anext(stream)
        os.kill(engine.channel.process.pid, signal.SIGKILL)
        rest = await asyncio.wait_for(_drain(stream), 10)
        assert rest[-1].finish_reason is FinishReason.ERROR and "killed by signal 9" in rest[-1].error
        assert "killed by signal 9" in await asyncio.wait_for(engine.wait_failed(), 5)
        with pytest.raises(EngineDiedError):
            engine.add_request(EngineRequest("b", (1, 2), params(2)))
        with pytest.raises(EngineDiedError):
            await engine.export_kv("a")
    finally:
        await engine.shutdown()


async def _drain(stream) -> list:
    return [out async for out in stream]


async def _collect(engine, request):
    tokens, last = [], None
    async for out in engine.add_request(request):
        tokens += out.new_token_ids
        last = out
    return tokens, last
