"""`/v1/responses`: create (whole or streamed), retrieve, list input items, delete. A response runs as a chat
completion through the gateway's own chat path (Serving.handle: admission, templates, tool calling, structured
output, metrics), so it honours exactly what chat does; this module maps to and from it and keeps the store. It
decides nothing about generation and builds no error body itself."""

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from services.gateway import errors
from services.gateway import responses_items as items
from services.gateway import responses_output as output
from services.gateway.admission import read_body
from services.gateway.openai_protocol import ChatCompletionRequest
from services.gateway.response_store import ResponseStore, StoredResponse, make_store
from services.gateway.responses_protocol import ResponsesRequest, parse_responses_request
from services.gateway.serving import Serving
from services.gateway.sse import SseResponse

log = logging.getLogger(__name__)
ROUTE = "/v1/responses"
# the chat request's parameter names as this endpoint's clients know them
_PARAMS = {"messages": "input", "max_completion_tokens": "max_output_tokens", "response_format": "text"}


class ResponseNotFoundError(errors.GatewayError):
    status, type, code = 404, "invalid_request_error", "not_found"


class StoreUnavailableError(errors.GatewayError):
    status, type, code, retry_after_s = 503, "service_unavailable_error", "store_unavailable", errors.RETRY_AFTER_S


class ResponsesApi:
    def __init__(self, serving: Serving, store: ResponseStore):
        self.serving, self.store = serving, store

    async def close(self) -> None:
        await self.store.close()

    async def create(self, request: Request) -> Response:
        owner = self._owner(request)
        try:
            req = parse_responses_request(await read_body(request, self.serving.settings.max_body_bytes))
            self.serving.check_model(req.model)
            history = await self._history(req.previous_response_id, owner)
            new_items = req.input_items()
            conversation = history + items.chat_messages(new_items)
            system = [{"role": "system", "content": req.instructions}] if req.instructions else []
            body = req.chat_body(system + conversation)
        except (errors.GatewayError, errors.EngineError) as exc:  # NOTE: counted here: chat never saw it
            self.serving.metrics.start(ROUTE, self.serving.model.name).finish(errors.status_of(exc))
            raise
        response_id = items.new_id("resp")
        chat = await self._run_chat(request, body, response_id)
        start = output.envelope(req, response_id, time.time())
        record = {"conversation": conversation, "input_items": items.input_records(new_items)}
        if not req.stream:
            response = output.whole(start, json.loads(chat.body))
            await self._maybe_store(req, owner, record | {"response": response})
            return JSONResponse(response)
        return _relay(
            chat,
            output.EventStream(start),
            lambda response: self._maybe_store(req, owner, record | {"response": response}),
        )

    async def retrieve(self, request: Request, response_id: str) -> dict:
        return (await self._load(response_id, self._owner(request))).record["response"]

    async def input_items(self, request: Request, response_id: str) -> dict:
        query = items.page_query(dict(request.query_params))
        stored = await self._load(response_id, self._owner(request))
        return items.page(stored.record["input_items"], **query)

    async def delete(self, request: Request, response_id: str) -> dict:
        await self._load(response_id, self._owner(request))
        await self._store_call(self.store.delete(response_id))
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    def _owner(self, request: Request) -> str:
        """Checks the API key; a digest of it owns what it stores (the key itself is never written anywhere)."""
        header = request.headers.get("authorization")
        self.serving.admission.check_key(header)
        if not self.serving.settings.api_keys:
            return ""
        return hashlib.sha256((header or "").removeprefix("Bearer ").strip().encode()).hexdigest()

    async def _load(self, response_id: str, owner: str) -> StoredResponse:
        stored = await self._store_call(self.store.get(response_id))
        if stored is None or stored.owner != owner:  # NOTE: another key's response is as absent as a missing one
            raise ResponseNotFoundError(f"Response with id '{response_id}' not found.")
        return stored

    async def _history(self, response_id: str | None, owner: str) -> list[dict]:
        if response_id is None:
            return []
        try:
            stored = await self._load(response_id, owner)
        except ResponseNotFoundError as exc:
            exc.param = "previous_response_id"
            raise
        record = stored.record
        return record["conversation"] + items.output_messages(record["response"]["output"])

    async def _maybe_store(self, req: ResponsesRequest, owner: str, record: dict) -> None:
        """`record`: the response, the conversation it continued (chat messages) and its own input items."""
        if req.store:
            await self._store_call(self.store.put(StoredResponse(record["response"]["id"], owner, record)))

    async def _store_call(self, call):
        try:
            return await call
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # sqlite3.Error, redis.RedisError, OSError: the store, not the request, failed
            log.warning("response store failed: %r", exc)
            raise StoreUnavailableError(f"the response store is unavailable: {type(exc).__name__}") from None

    async def _run_chat(self, request: Request, body: bytes, response_id: str) -> Response:
        try:
            return await self.serving.handle(_inner_request(request, body), ROUTE, ChatCompletionRequest, response_id)
        except (errors.GatewayError, errors.EngineError) as exc:
            exc.param = _PARAMS.get(exc.param, exc.param)
            raise


def make_api(serving: Serving) -> ResponsesApi:
    settings = serving.settings
    return ResponsesApi(
        serving,
        make_store(
            settings.response_store,
            path=settings.response_store_file,
            redis_url=settings.redis_url,
            ttl_s=settings.response_ttl_s,
            redis_password=settings.redis_password,
        ),
    )


def add_routes(app: FastAPI, api: ResponsesApi) -> None:
    @app.post(ROUTE)
    async def create_response(request: Request) -> Response:
        return await api.create(request)

    @app.get(ROUTE + "/{response_id}")
    async def get_response(response_id: str, request: Request) -> dict:
        return await api.retrieve(request, response_id)

    @app.get(ROUTE + "/{response_id}/input_items")
    async def list_input_items(response_id: str, request: Request) -> dict:
        return await api.input_items(request, response_id)

    @app.delete(ROUTE + "/{response_id}")
    async def delete_response(response_id: str, request: Request) -> dict:
        return await api.delete(request, response_id)


def _inner_request(outer: Request, body: bytes) -> Request:
    """The chat request this response runs as: the client's headers (its API key) with `body`; after the body, it
    hears the client's own connection, so a client that leaves cancels the work."""
    headers = [(k, v) for k, v in outer.scope["headers"] if k not in (b"content-length", b"content-type")]
    headers += [(b"content-length", str(len(body)).encode()), (b"content-type", b"application/json")]
    is_sent = False

    async def receive() -> dict:
        nonlocal is_sent
        if not is_sent:
            is_sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await outer.receive()

    return Request(dict(outer.scope, headers=headers, path="/v1/chat/completions"), receive)


def _relay(chat: Response, events: output.EventStream, on_done) -> SseResponse:
    """Run the chat stream (an SSE response) into a queue and answer with Responses events made from it."""
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()
    gone = asyncio.Event()

    async def send(message: dict) -> None:
        if message["type"] == "http.response.body":
            if message.get("body"):
                await queue.put(message["body"])
            if not message.get("more_body", False):
                await queue.put(None)

    async def receive() -> dict:
        await gone.wait()
        return {"type": "http.disconnect"}

    task = asyncio.ensure_future(chat({"type": "http"}, receive, send))

    async def on_close() -> None:
        gone.set()  # NOTE: the chat stream stops (and frees its slot) however ours ended
        await asyncio.wait({task})

    return SseResponse(_events(queue, events, on_done), on_close)


async def _events(queue: asyncio.Queue, events: output.EventStream, on_done) -> AsyncIterator[bytes]:
    for event in events.start():
        yield json.dumps(event).encode()
    while (body := await queue.get()) is not None:
        data = body.removeprefix(b"data: ").strip()
        if data == b"[DONE]" or not data:
            continue
        chunk = json.loads(data)
        if "error" in chunk:
            for event in events.fail(chunk["error"]):
                yield json.dumps(event).encode()
            return
        for event in events.on_chunk(chunk):
            yield json.dumps(event).encode()
    final = events.finish()
    try:
        await on_done(final[-1]["response"])  # NOTE: stored before the client hears it is complete
    except errors.GatewayError as exc:
        final = events.fail(exc.body()["error"])
    for event in final:
        yield json.dumps(event).encode()
