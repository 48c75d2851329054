"""The gateway's OpenAPI document (/openapi.json): each route, its request body as the pydantic models that parse
it define it, and every status it may answer with and that answer's body: OpenAI's shapes on success, the
OpenAI-style error object otherwise, Retry-After on 429 and 503. Fuzzing (schemathesis) holds the gateway to it.

Built once from the models; no I/O, no routes.
"""

from services.gateway.errors import RETRY_AFTER_S
from services.gateway.openai_protocol import ChatCompletionRequest, CompletionRequest
from services.gateway.responses_openapi import add_responses

_REF = "#/components/schemas/{model}"
_NULLABLE_STR = {"anyOf": [{"type": "string"}, {"type": "null"}]}
_USAGE = {
    "type": "object",
    "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
    "properties": {
        "prompt_tokens": {"type": "integer", "minimum": 0},
        "completion_tokens": {"type": "integer", "minimum": 0},
        "total_tokens": {"type": "integer", "minimum": 0},
        "prompt_tokens_details": {"type": "object", "properties": {"cached_tokens": {"type": "integer", "minimum": 0}}},
    },
}
# Open API 3.1 reads the schema of text/event-stream as that of each event; `data` is a JSON chunk, an error
# object after a failure mid-stream, or the closing "[DONE]"
_SSE_EVENT = {
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string", "minLength": 1}, "event": {"type": "string"}, "id": {"type": "string"}},
}
_FINISH = {"anyOf": [{"type": "string", "enum": ["stop", "length"]}, {"type": "null"}]}


def _envelope(obj: str, choice: dict) -> dict:
    return {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices", "usage"],
        "properties": {
            "id": {"type": "string"},
            "object": {"type": "string", "enum": [obj]},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {"type": "array", "items": choice},
            "usage": _USAGE,
        },
    }


_CHAT_CHOICE = {
    "type": "object",
    "required": ["index", "message", "finish_reason"],
    "properties": {
        "index": {"type": "integer", "minimum": 0},
        "finish_reason": _FINISH,
        "message": {
            "type": "object",
            "required": ["role", "content"],
            "properties": {"role": {"type": "string", "enum": ["assistant"]}, "content": {"type": "string"}},
        },
        "logprobs": {"anyOf": [{"type": "object", "required": ["content"]}, {"type": "null"}]},
    },
}
_TEXT_CHOICE = {
    "type": "object",
    "required": ["index", "text", "finish_reason"],
    "properties": {
        "index": {"type": "integer", "minimum": 0},
        "text": {"type": "string"},
        "finish_reason": _FINISH,
        "logprobs": {"anyOf": [{"type": "object", "required": ["tokens", "token_logprobs"]}, {"type": "null"}]},
    },
}
_MODEL = {
    "type": "object",
    "required": ["id", "object", "created", "owned_by"],
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string", "enum": ["model"]},
        "created": {"type": "integer"},
        "owned_by": {"type": "string"},
        "max_model_len": {"type": "integer"},
    },
}
_ERROR = {
    "type": "object",
    "required": ["error"],
    "additionalProperties": False,
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "additionalProperties": False,
            "properties": {
                "message": {"type": "string", "minLength": 1},
                "type": {"type": "string"},
                "param": _NULLABLE_STR,
                "code": _NULLABLE_STR,
            },
        }
    },
}
_SCHEMAS = {
    "ChatCompletion": _envelope("chat.completion", _CHAT_CHOICE),
    "Completion": _envelope("text_completion", _TEXT_CHOICE),
    "Model": _MODEL,
    "Error": _ERROR,
    "ModelList": {
        "type": "object",
        "required": ["object", "data"],
        "properties": {
            "object": {"type": "string", "enum": ["list"]},
            "data": {"type": "array", "items": {"$ref": _REF.format(model="Model")}},
        },
    },
}
_WHY = {
    400: "the request is invalid (a field, a value, or a combination this server does not take)",
    401: "an API key is required (TANDEM_API_KEYS) and none or a wrong one was sent",
    404: "no such model (or, on /v1/responses, no such stored response)",
    413: "the body, or the prompt, is too large",
    429: "the gateway is serving its limit of requests (TANDEM_GATEWAY_MAX_INFLIGHT); retry after Retry-After",
    503: "no worker can take the request now, or every worker is busy; retry after Retry-After",
    504: "the request took longer than the gateway's request timeout",
}


def _ref(name: str) -> dict:
    return {"$ref": _REF.format(model=name)}


def _error(status: int) -> dict:
    response = {"description": _WHY[status], "content": {"application/json": {"schema": _ref("Error")}}}
    if status in (429, 503):
        response["headers"] = {
            "Retry-After": {
                "required": True,
                "description": "seconds to wait",
                "schema": {"type": "string", "example": str(RETRY_AFTER_S)},
            }
        }
    return response


def _completion_route(summary: str, request: str, response: str) -> dict:
    ok = {
        "description": "the completion, whole (application/json) or, with `stream`, as server-sent events "
        "whose last one is `data: [DONE]` (or, after a failure mid-stream, an error object)",
        "content": {"application/json": {"schema": _ref(response)}, "text/event-stream": {"schema": _SSE_EVENT}},
    }
    return {
        "post": {
            "summary": summary,
            "operationId": request,
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
            "responses": {"200": ok, **{str(s): _error(s) for s in (400, 401, 404, 413, 429, 503, 504)}},
        }
    }


def _get(summary: str, op: str, ok: dict, *errors: int, parameters: list | None = None) -> dict:
    route = {"summary": summary, "operationId": op, "responses": {"200": ok, **{str(s): _error(s) for s in errors}}}
    return {"get": {**route, "parameters": parameters} if parameters else route}


def _json(description: str, schema: dict) -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def build_schema(title: str, version: str) -> dict:
    schemas = {**_SCHEMAS}
    for model in (ChatCompletionRequest, CompletionRequest):
        schema = model.model_json_schema(ref_template=_REF)
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    status = {
        "type": "object",
        "required": ["status"],
        "properties": {"status": {"type": "string"}, "reason": {"type": "string"}},
    }
    name = [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}]
    paths = {
        "/v1/chat/completions": _completion_route("Chat completion", "ChatCompletionRequest", "ChatCompletion"),
        "/v1/completions": _completion_route("Text completion", "CompletionRequest", "Completion"),
        "/v1/models": _get("The served model", "listModels", _json("the model list", _ref("ModelList")), 401),
        "/v1/models/{name}": _get(
            "One model", "getModel", _json("the model", _ref("Model")), 401, 404, parameters=name
        ),
        "/health": _get("Liveness", "health", _json("the process serves", status)),
        "/ready": {
            "get": {
                "summary": "Readiness",
                "operationId": "ready",
                "responses": {
                    "200": _json("a router answers and lists a live decode worker", status),
                    "503": _json("not ready, and why", status),
                },
            }
        },
        "/metrics": _get(
            "Prometheus metrics",
            "metrics",
            {"description": "the text exposition format", "content": {"text/plain": {"schema": {"type": "string"}}}},
        ),
    }
    add_responses(paths, schemas, _error)
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": {"schemas": schemas},
    }
