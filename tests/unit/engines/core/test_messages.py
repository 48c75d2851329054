"""The engine-process messages cross the pipe as themselves: every field, typed errors, no hand-kept order."""

from dataclasses import fields

import pytest

from engines.base.errors import EngineBusyError, EngineError, InvalidRequestError
from engines.base.structured import StructuredSpec
from engines.base.types import EngineRequest, KvExport, KvLayout, SamplingParams
from engines.core.messages import Abort, Add, Call, Failed, Reply, Stop, decode, encode

# a value away from the default for each sampling field: a new field without one here fails the test below
AWAY = {
    "max_tokens": 9,
    "temperature": 0.5,
    "top_k": 3,
    "top_p": 0.5,
    "seed": 11,
    "stop_token_ids": (4, 5),
    "ignore_eos": True,
    "logprobs": True,
    "top_logprobs": 2,
    "min_tokens": 1,
    "presence_penalty": 0.5,
    "frequency_penalty": -0.5,
    "repetition_penalty": 1.5,
    "min_p": 0.1,
    "logit_bias": ((1, 2.0), (3, -1.0)),
    "cache_salt": "t:a",
    "structured": StructuredSpec("json_object", "", "response_format"),
}


def test_every_sampling_field_survives_the_pipe():
    names = [f.name for f in fields(SamplingParams)]
    assert sorted(names) == sorted(AWAY)
    params = SamplingParams(**AWAY)
    assert all(getattr(params, n) != f.default for n, f in zip(names, fields(SamplingParams)))
    request = EngineRequest("r", (1, 2, 3), params, hash_root=2**64 - 1)
    assert decode(encode(Add(request))) == Add(request)


KV = KvExport(KvLayout(1, 1, 2, "float32", 4), (1,), 1, b"\x00" * 32, (0.5,))


@pytest.mark.parametrize(
    "message",
    [
        Abort("r"),
        Stop(),
        Call(1, "export_kv", "r"),
        Call(3, "reset_prefix_cache"),
        Call(2, "export_kv", ("r", "/x", 4)),
        Reply(7, b"handle"),
        Reply(4, 7),
        Reply(5),
        Reply(6, KV),
    ],
)
def test_commands_and_replies_survive_the_pipe(message):
    assert decode(encode(message)) == message


def test_errors_cross_as_their_engine_type_and_others_as_engine_error():
    busy = decode(encode(Reply(1, error=EngineBusyError("held"))))
    assert type(busy.error) is EngineBusyError and str(busy.error) == "held"
    bad = decode(encode(Failed(InvalidRequestError("no"))))
    assert type(bad.error) is InvalidRequestError
    other = decode(encode(Failed(RuntimeError("boom"))))
    assert type(other.error) is EngineError and str(other.error) == "RuntimeError: boom"
