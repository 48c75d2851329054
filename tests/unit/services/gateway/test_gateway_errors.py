"""Every error status the gateway produces, with OpenAI's body `{"error": {message, type, param, code}}`."""

import grpc
import openai
import pytest
from fastapi import FastAPI
from pydantic import BaseModel
from starlette.testclient import TestClient

from services.gateway import errors
from tests.unit.services.gateway.conftest import MODEL

MESSAGES = [{"role": "user", "content": "hi"}]


def error_of(response) -> dict:
    body = response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


async def test_400_unknown_and_unsupported_fields_are_named(stack):
    with pytest.raises(openai.BadRequestError) as info:
        await stack.client.chat.completions.create(model=MODEL, messages=MESSAGES, extra_body={"typical_p": 0.5})
    assert info.value.status_code == 400 and info.value.param == "typical_p" and "typical_p" in info.value.message
    with pytest.raises(openai.BadRequestError) as info:
        await stack.client.chat.completions.create(model=MODEL, messages=MESSAGES, functions=[{"name": "f"}])
    assert info.value.param == "functions"
    assert stack.router.routes == []  # bad input never reaches the router


async def test_400_bad_json_and_bad_values(stack):
    response = await stack.http.post(
        "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400 and error_of(response)["type"] == "invalid_request_error"
    response = await stack.http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "temperature": "hot"})
    assert response.status_code == 400 and error_of(response)["param"] == "temperature"


async def test_400_from_worker_invalid_argument(stack):
    stack.decode.generate_error = (0, grpc.StatusCode.INVALID_ARGUMENT)
    response = await stack.http.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
    assert response.status_code == 400 and error_of(response)["message"] == "worker died"


def test_422_validation_becomes_400():
    class Body(BaseModel):
        count: int

    app = FastAPI()
    errors.install_handlers(app)

    @app.post("/echo")
    async def echo(body: Body) -> int:
        return body.count

    response = TestClient(app).post("/echo", json={"count": "many"})
    assert response.status_code == 400 and error_of(response)["param"] == "count"


async def test_401_wrong_or_missing_key(stack_with):
    async with stack_with(api_keys=("sk-right", "sk-other")) as stack:
        out = await stack.client.completions.create(model=MODEL, prompt="x", max_tokens=1)
        assert out.choices[0].text
        wrong = openai.AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key="sk-wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            await wrong.completions.create(model=MODEL, prompt="x")
        with pytest.raises(openai.AuthenticationError):
            await wrong.models.list()
        await wrong.close()
        response = await stack.http.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
        assert response.status_code == 401 and error_of(response)["type"] == "authentication_error"
        assert (await stack.http.get("/health")).status_code == 200  # probes need no key


async def test_404_unknown_model_and_route(stack):
    with pytest.raises(openai.NotFoundError) as info:
        await stack.client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert info.value.code == "model_not_found" and info.value.param == "model"
    response = await stack.http.get("/v1/nothing")
    assert response.status_code == 404 and error_of(response)["code"] == "not_found"


async def test_413_body_too_large_before_parsing(stack_with):
    async with stack_with(max_body_bytes=1000) as stack:
        response = await stack.http.post("/v1/completions", content=b"x" * 2000)  # not even JSON
        assert response.status_code == 413 and error_of(response)["code"] == "request_too_large"


async def test_413_prompt_longer_than_context(stack):
    with pytest.raises(openai.APIStatusError) as info:
        await stack.client.completions.create(model=MODEL, prompt=[5] * 512)  # 512 tokens: no room
    assert info.value.status_code == 413 and info.value.code == "context_length_exceeded"
    # 511 + 1 fits; a max_tokens past the context left is the user's error, a 400 naming it
    with pytest.raises(openai.BadRequestError) as info:
        await stack.client.completions.create(model=MODEL, prompt=[5] * 511, max_tokens=50)
    assert info.value.param == "max_tokens" and "at most 1" in info.value.message
    await stack.client.completions.create(model=MODEL, prompt=[5] * 511, max_tokens=1)
    assert stack.decode.generate_requests[0].params.max_tokens == 1


async def test_429_when_inflight_limit_is_hit(stack_with):
    async with stack_with(max_inflight=1) as stack:
        stack.decode.hang_after = 1
        first = await stack.client.completions.create(model=MODEL, prompt="x", stream=True)
        await anext(aiter(first))
        response = await stack.http.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
        assert response.status_code == 429 and response.headers["retry-after"] == "1"
        assert error_of(response)["type"] == "rate_limit_error"
        await first.close()
        stack.decode.hang_after = None
        await stack.wait_until_idle()
        out = await stack.client.completions.create(model=MODEL, prompt="x", max_tokens=2)
        assert out.usage.completion_tokens == 2


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("route_status", "code"),
    [
        (grpc.StatusCode.UNAVAILABLE, "no_worker_available"),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "workers_busy"),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "no_worker_available"),
    ],
)
async def test_503_when_no_worker_is_available_or_every_one_is_busy(stack, stream, route_status, code):
    stack.router.route_error = route_status
    response = await stack.http.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, "stream": stream}
    )
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert error_of(response)["code"] == code
    assert error_of(response)["type"] == "service_unavailable_error"


async def test_the_context_length_is_the_one_the_workers_report(stack):
    stack.router.max_model_len = 64  # what the engines computed, as the router lists it
    card = (await stack.http.get("/v1/models")).json()["data"][0]
    assert card["max_model_len"] == 64
    with pytest.raises(openai.APIStatusError) as info:
        await stack.client.completions.create(model=MODEL, prompt=[5] * 64)
    assert info.value.status_code == 413 and "maximum context length is 64" in info.value.message
