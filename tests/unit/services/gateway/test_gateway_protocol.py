"""Request validation: every field the server does not support is a 400 naming it; the rest map exactly."""

import json

import pytest

from services.gateway.errors import InvalidRequestError, status_of
from services.gateway.openai_protocol import ChatCompletionRequest, CompletionRequest, parse_request

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "m", "prompt": "hi"}


def chat(**fields) -> ChatCompletionRequest:
    return parse_request(ChatCompletionRequest, json.dumps({**CHAT, **fields}).encode())


def completion(**fields) -> CompletionRequest:
    return parse_request(CompletionRequest, json.dumps({**COMPLETION, **fields}).encode())


def rejected(parse, fields: dict) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as info:
        parse(**fields)
    assert status_of(info.value) == 400
    return info.value


@pytest.mark.parametrize(
    "name, value",
    [
        ("functions", [{"name": "f"}]),
        ("function_call", "auto"),
        ("presence_penalty", 2.5),  # out of OpenAI's [-2, 2]
        ("frequency_penalty", -3),
        ("audio", {"voice": "alloy"}),
        ("modalities", ["text", "audio"]),
        ("prediction", {"type": "content", "content": "x"}),
        ("store", True),
        ("metadata", {"k": "v"}),
        ("reasoning_effort", "high"),
        ("service_tier", "flex"),
        ("web_search_options", {"search_context_size": "low"}),
        ("typical_p", 0.5),  # not an OpenAI field, nor one tandem honours
        ("top_k", -2),  # vLLM's field: -1 and 0 are off, below is nothing
        ("echo", True),  # a completions field
    ],
)
def test_chat_rejects_by_name(name, value):
    err = rejected(chat, {name: value})
    assert err.param == name and name in err.message


@pytest.mark.parametrize(
    "name, value",
    [
        ("echo", True),
        ("best_of", 3),
        ("suffix", "tail"),
        ("repetition_penalty", 0),
        ("presence_penalty", 3),
        ("messages", []),
        ("tools", []),
    ],
)
def test_completion_rejects_by_name(name, value):
    err = rejected(completion, {name: value})
    assert err.param == name


@pytest.mark.parametrize(
    "name, value",
    [
        ("temperature", 2.5),
        ("temperature", -0.1),
        ("top_p", 0),
        ("top_p", 1.5),
        ("n", 0),
        ("n", 17),
        ("max_tokens", 0),
        ("max_completion_tokens", 0),
        ("top_logprobs", 21),
        ("stop", [""]),
        ("stop", [str(i) for i in range(17)]),
        ("stream", "sometimes"),
    ],
)
def test_bad_values_name_the_field(name, value):
    assert rejected(chat, {name: value}).param == name


def test_cross_field_rules():
    assert rejected(chat, {"top_logprobs": 3}).param == "top_logprobs"  # without logprobs=true
    assert rejected(chat, {"stream_options": {"include_usage": True}}).param == "stream_options"
    assert rejected(chat, {"messages": []}).param == "messages"
    err = rejected(chat, {"messages": [{"role": "robot", "content": "x"}]})
    assert err.param == "messages" and err.message.startswith("messages.0.role")
    image = [{"type": "image_url", "image_url": {"url": "http://x"}}]
    err = rejected(chat, {"messages": [{"role": "user", "content": image}]})
    assert err.param == "messages" and err.message.startswith("messages.0.content")
    assert rejected(completion, {"prompt": {"text": "x"}}).param == "prompt"
    with pytest.raises(InvalidRequestError) as info:
        parse_request(ChatCompletionRequest, b'{"messages": []}')
    assert info.value.param in ("model", "messages")
    with pytest.raises(InvalidRequestError, match="parse the JSON"):
        parse_request(ChatCompletionRequest, b"{oops")


def test_completion_prompts():
    assert completion(prompt="hi").prompts() == ["hi"]
    assert completion(prompt=["hi"]).prompts() == ["hi"]
    assert completion(prompt=[1, 2, 3]).prompts() == [[1, 2, 3]]
    assert completion(prompt=[[1, 2]]).prompts() == [[1, 2]]
    for prompt in ([], [[1], []]):
        with pytest.raises(InvalidRequestError) as info:
            completion(prompt=prompt).prompts()
        assert info.value.param == "prompt"


def test_off_values_are_accepted():
    req = chat(
        presence_penalty=0,
        frequency_penalty=0.0,
        logit_bias={},
        tool_choice="none",
        response_format={"type": "text"},
        store=False,
        service_tier="auto",
        user="u1",
    )
    assert req.user == "u1"
    assert completion(echo=False, best_of=1, suffix=None).echo is False


def test_sampling_params_mapping():
    req = chat(
        temperature=0.3,
        top_p=0.9,
        seed=11,
        logprobs=True,
        top_logprobs=4,
        stop="END",
        max_tokens=5,
        max_completion_tokens=7,
    )
    params = req.sampling_params(req.requested_max_tokens())
    assert (params.max_tokens, params.temperature, params.top_p, params.seed) == (7, 0.3, 0.9, 11)
    assert (params.logprobs, params.top_logprobs) == (True, 4)
    assert req.stop_strings() == ("END",)
    defaults = chat().sampling_params(9)
    assert (defaults.temperature, defaults.top_p, defaults.logprobs, defaults.seed) == (1.0, 1.0, False, None)
    legacy = completion(logprobs=0)
    assert legacy.requested_max_tokens() == 16 and legacy.sampling_params(16).logprobs
    assert completion().sampling_params(16).logprobs is False
    assert chat(stop=["a", "b", "a"]).stop_strings() == ("a", "b")


@pytest.mark.parametrize("parse", [chat, completion])
def test_ignore_eos_and_min_tokens_map_to_sampling_params(parse):
    params = parse(ignore_eos=True, min_tokens=4, max_tokens=8).sampling_params(8)
    assert (params.ignore_eos, params.min_tokens, params.max_tokens) == (True, 4, 8)
    params = parse().sampling_params(8)
    assert (params.ignore_eos, params.min_tokens) == (False, 0)


@pytest.mark.parametrize("parse", [chat, completion])
@pytest.mark.parametrize(
    "fields",
    [
        {"min_tokens": 9, "max_tokens": 8},
        {"min_tokens": -1},
        {"min_tokens": 1.5},
        {"min_tokens": "3"},
        {"ignore_eos": "maybe"},
        {"ignore_eos": None},
    ],
)
def test_bad_ignore_eos_or_min_tokens_are_400s(parse, fields):
    err = rejected(parse, fields)
    assert err.param == ("ignore_eos" if "ignore_eos" in fields else "min_tokens")


def test_min_tokens_beyond_what_the_context_leaves_is_a_400():
    """Without max_tokens the limit is what the context holds; min_tokens above it cannot be honoured."""
    req = chat(min_tokens=100)
    with pytest.raises(InvalidRequestError) as info:
        req.sampling_params(99)
    assert info.value.param == "min_tokens" and "max_tokens=99" in str(info.value)


def test_sampling_params_validate_min_tokens():
    from engines.base.errors import InvalidRequestError as EngineInvalid
    from engines.base.types import SamplingParams

    SamplingParams(max_tokens=4, min_tokens=4).validate()
    for bad in (5, -1):
        with pytest.raises(EngineInvalid, match="min_tokens"):
            SamplingParams(max_tokens=4, min_tokens=bad).validate()
