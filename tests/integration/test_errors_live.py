"""Every error a client can meet, against a live stack (tiny model without EOS, API keys, one in-flight slot,
a 64 KiB body limit): the status, the OpenAI error body, and Retry-After where retrying helps."""

import json
import signal

import httpx
import pytest

from tests.integration.conftest import ENDLESS_CONTEXT, running_stack, workers
from tests.integration.helpers import assert_error, sse_json, wait_for

KEYS = ("sk-test-one", "sk-test-two")
MAX_BODY_BYTES = 65536
AUTH = {"Authorization": f"Bearer {KEYS[0]}"}


@pytest.fixture(scope="module")
def stack(endless_model, tmp_path_factory):
    gateway_args = ("--api-keys", ",".join(KEYS), "--max-inflight", "1", "--max-body-bytes", str(MAX_BODY_BYTES))
    with running_stack(
        endless_model, tmp_path_factory.mktemp("errors"), num_prefill=0, num_decode=1, gateway_args=gateway_args
    ) as running:
        yield running


@pytest.fixture(scope="module")
def http(stack):
    with httpx.Client(base_url=stack.url, headers=AUTH, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def model(endless_model) -> str:
    return endless_model.name


def _chat(model: str, **kw) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **kw}


# -- 401 ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer sk-wrong"},
        {"Authorization": f"Basic {KEYS[0]}"},
        {"Authorization": "Bearer"},
        {"Authorization": KEYS[0]},
    ],
    ids=["missing", "wrong", "basic-scheme", "empty-bearer", "no-scheme"],
)
@pytest.mark.parametrize(
    "method,path", [("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("GET", "/v1/models")]
)
def test_bad_api_key_is_401(stack, model, headers, method, path):
    body = _chat(model) if path.endswith("chat/completions") else {"model": model, "prompt": "hi"}
    response = httpx.request(
        method, stack.url + path, headers=headers, timeout=10, json=body if method == "POST" else None
    )
    assert_error(response, 401, type="authentication_error", code="invalid_api_key")


@pytest.mark.parametrize("key", KEYS)
def test_every_configured_key_is_accepted(stack, model, key):
    response = httpx.post(
        f"{stack.url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, json=_chat(model), timeout=30
    )
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 4


def test_health_needs_no_key(stack):
    assert httpx.get(f"{stack.url}/health", timeout=5).status_code == 200


# -- 404 / 405 ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_unknown_model_is_404(http, path):
    body = _chat("gpt-4o") if "chat" in path else {"model": "gpt-4o", "prompt": "hi"}
    err = assert_error(
        http.post(path, json=body), 404, type="invalid_request_error", code="model_not_found", param="model"
    )
    assert "gpt-4o" in err["message"]


def test_unknown_model_card_is_404(http, model):
    assert http.get(f"/v1/models/{model}").json()["id"] == model
    assert_error(
        http.get("/v1/models/gpt-4o"), 404, type="invalid_request_error", code="model_not_found", param="model"
    )


def test_unknown_route_is_404_and_wrong_method_405(http):
    assert_error(http.post("/v1/embeddings", json={}), 404, type="invalid_request_error", code="not_found")
    assert_error(http.get("/v1/chat/completions"), 405, type="invalid_request_error", code="method_not_allowed")


# -- 400 ---------------------------------------------------------------------------------------------------
BAD_CHAT = {
    "top_p-above-1": ({"top_p": 2}, "top_p"),
    "top_p-zero": ({"top_p": 0}, "top_p"),
    "temperature-negative": ({"temperature": -0.5}, "temperature"),
    "temperature-above-2": ({"temperature": 2.5}, "temperature"),
    "max_tokens-zero": ({"max_tokens": 0}, "max_tokens"),
    "n-zero": ({"n": 0}, "n"),
    "n-too-many": ({"n": 17}, "n"),
    "unknown-field": ({"frobnicate": True}, "frobnicate"),
    "presence_penalty": ({"presence_penalty": 2.5}, "presence_penalty"),  # OpenAI's range is [-2, 2]
    "logit_bias": ({"logit_bias": {"five": 10}}, "logit_bias"),
    "tool_choice-unknown-function": (
        {
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "g"}},
        },
        "tool_choice",
    ),
    "stream_options-without-stream": ({"stream_options": {"include_usage": True}}, "stream_options"),
    "top_logprobs-without-logprobs": ({"top_logprobs": 2}, "top_logprobs"),
    "empty-messages": ({"messages": []}, "messages"),
    "bad-role": ({"messages": [{"role": "robot", "content": "hi"}]}, "messages"),
    "empty-stop": ({"stop": [""]}, "stop"),
}


@pytest.mark.parametrize(
    "name,stream",
    [
        (name, stream)
        for name in sorted(BAD_CHAT)
        for stream in (False, True)
        if not (stream and name == "stream_options-without-stream")
    ],
)
def test_bad_parameter_is_400_naming_it(http, model, name, stream):
    """Refused before any work starts, streaming or not."""
    fields, param = BAD_CHAT[name]
    body = {**_chat(model), "stream": stream, **fields}
    assert_error(http.post("/v1/chat/completions", json=body), 400, type="invalid_request_error", param=param)


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"", b"[]", json.dumps({"messages": []}).encode()],
    ids=["broken", "empty", "array", "no-model"],
)
def test_malformed_body_is_400(http, content):
    response = http.post("/v1/chat/completions", content=content, headers={"Content-Type": "application/json"})
    assert_error(
        response, 400, type="invalid_request_error", param="model" if content.startswith(b'{"messages"') else None
    )


def test_out_of_vocabulary_token_prompt_is_400(http, model):
    assert_error(
        http.post("/v1/completions", json={"model": model, "prompt": [1, 2, 512]}),
        400,
        type="invalid_request_error",
        param="prompt",
    )


# -- 413 ---------------------------------------------------------------------------------------------------
def test_prompt_filling_the_context_is_413(http, model):
    prompt = [5] * ENDLESS_CONTEXT
    err = assert_error(
        http.post("/v1/completions", json={"model": model, "prompt": prompt}),
        413,
        type="invalid_request_error",
        code="context_length_exceeded",
        param="prompt",
    )
    assert str(ENDLESS_CONTEXT) in err["message"]


def test_long_chat_is_413(http, model):
    content = " ".join(f"word{i}" for i in range(ENDLESS_CONTEXT))  # several tokens a word
    assert len(json.dumps(content)) < MAX_BODY_BYTES
    assert_error(
        http.post("/v1/chat/completions", json=_chat(model, messages=[{"role": "user", "content": content}])),
        413,
        type="invalid_request_error",
        code="context_length_exceeded",
        param="messages",
    )


def test_prompt_one_short_of_the_context_gets_one_token(http, model):
    """The boundary: a prompt that leaves room for exactly one token is served with max_tokens 1; a larger
    max_tokens is a 400 naming it (as OpenAI and vLLM answer)."""
    prompt = [5] * (ENDLESS_CONTEXT - 1)
    assert_error(
        http.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 50}),
        400,
        type="invalid_request_error",
        param="max_tokens",
    )
    response = http.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0})
    assert response.status_code == 200, response.text
    body = response.json()
    assert 0 <= body["usage"].pop("prompt_tokens_details")["cached_tokens"] < ENDLESS_CONTEXT - 1
    assert body["usage"] == {
        "prompt_tokens": ENDLESS_CONTEXT - 1,
        "completion_tokens": 1,
        "total_tokens": ENDLESS_CONTEXT,
    }
    assert body["choices"][0]["finish_reason"] == "length"


def test_body_over_the_limit_is_413(http, model):
    body = json.dumps({"model": model, "prompt": "a" * MAX_BODY_BYTES}).encode()
    assert_error(
        http.post("/v1/completions", content=body, headers={"Content-Type": "application/json"}),
        413,
        type="invalid_request_error",
        code="request_too_large",
    )


def test_chunked_body_over_the_limit_is_413(http, model):
    """No Content-Length: the limit holds while the body streams in."""

    def chunks():
        yield b'{"model": "' + model.encode() + b'", "prompt": "'
        for _ in range(MAX_BODY_BYTES // 4096 + 1):
            yield b"a" * 4096
        yield b'"}'

    response = http.post("/v1/completions", content=chunks(), headers={"Content-Type": "application/json"})
    assert "content-length" not in response.request.headers
    assert_error(response, 413, type="invalid_request_error", code="request_too_large")


# -- 429 ---------------------------------------------------------------------------------------------------
def test_second_request_while_one_streams_is_429(http, model):
    body = {"model": model, "prompt": "the one slot", "max_tokens": ENDLESS_CONTEXT - 100, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as held:
        assert held.status_code == 200
        events = sse_json(held)  # NOTE: keep it: a discarded generator closes the response, and the stream
        next(events)  # admitted and streaming: the only slot is taken
        for extra in (_chat(model), _chat(model, stream=True)):
            assert_error(
                http.post("/v1/chat/completions", json=extra),
                429,
                type="rate_limit_error",
                code="rate_limit_exceeded",
                retry_after="1",
            )
        assert next(events)["choices"][0]["finish_reason"] is None  # the held stream went on meanwhile
    # closing the stream frees the slot
    wait_for(
        lambda: http.post("/v1/chat/completions", json=_chat(model)).status_code,
        lambda s: s == 200,
        5.0,
        "a request admitted after the held stream closed",
    )


# -- 503 (last: it stops the only decode worker) -----------------------------------------------------------
def test_no_decode_worker_is_503(stack, http, model):
    (decode,) = [c for c in stack.children if c.name == "decode-0"]
    decode.proc.send_signal(signal.SIGTERM)  # a clean stop deregisters it at once
    decode.proc.wait(timeout=20)
    wait_for(lambda: len(workers(stack)), lambda n: n == 0, 5.0, "the router forgetting the stopped worker")

    for path, body in (
        ("/v1/chat/completions", _chat(model)),
        ("/v1/chat/completions", _chat(model, stream=True)),
        ("/v1/completions", {"model": model, "prompt": "hi"}),
    ):
        assert_error(
            http.post(path, json=body),
            503,
            type="service_unavailable_error",
            code="no_worker_available",
            retry_after="1",
        )
    ready = httpx.get(f"{stack.url}/ready", timeout=5)
    assert (ready.status_code, ready.json()) == (503, {"status": "unavailable", "reason": "no live decode worker"})
    assert httpx.get(f"{stack.url}/health", timeout=5).status_code == 200
    # admission checks still come first
    assert_error(
        httpx.post(f"{stack.url}/v1/completions", json={"model": model, "prompt": "hi"}, timeout=5),
        401,
        type="authentication_error",
        code="invalid_api_key",
    )
