"""The OpenAPI description of `/v1/responses` (create, retrieve, input items, delete), merged into the gateway's
document by openapi.py so that fuzzing holds these routes to it too. Built from the request model; no I/O, no
routes."""

from services.gateway.responses_protocol import ResponsesRequest

_REF = "#/components/schemas/{model}"
_ITEM = {"type": "object", "required": ["type"], "properties": {"type": {"type": "string"}, "id": {"type": "string"}}}
_RESPONSE = {
    "type": "object",
    "required": ["id", "object", "created_at", "status", "model", "output"],
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string", "enum": ["response"]},
        "created_at": {"type": "number"},
        "status": {"type": "string", "enum": ["completed", "incomplete", "failed", "in_progress"]},
        "model": {"type": "string"},
        "output": {"type": "array", "items": _ITEM},
    },
}
_DELETED = {
    "type": "object",
    "required": ["id", "object", "deleted"],
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string", "enum": ["response.deleted"]},
        "deleted": {"type": "boolean", "enum": [True]},
    },
}
_SSE_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string", "minLength": 1}}}
_ID = [{"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}]
_PAGE = [
    {"name": "order", "in": "query", "schema": {"type": "string", "enum": ["asc", "desc"]}},
    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 100}},
    {"name": "after", "in": "query", "schema": {"type": "string"}},
]
_LIST = {
    "type": "object",
    "required": ["object", "data", "has_more"],
    "properties": {
        "object": {"type": "string", "enum": ["list"]},
        "data": {"type": "array", "items": _ITEM},
        "has_more": {"type": "boolean"},
    },
}


def add_responses(paths: dict, schemas: dict, error) -> None:
    """Adds the routes to `paths` and their bodies to `schemas`; `error(status)` is a documented error answer."""
    schema = ResponsesRequest.model_json_schema(ref_template=_REF, by_alias=True)
    schemas.update(schema.pop("$defs", {}))
    schemas |= {
        "ResponsesRequest": schema,
        "Response": _RESPONSE,
        "ResponseDeleted": _DELETED,
        "ResponseItemList": _LIST,
    }
    ok = {
        "description": "the response, whole (application/json) or, with `stream`, as server-sent events "
        "(response.created ... response.completed, each with its sequence_number)",
        "content": {
            "application/json": {"schema": {"$ref": _REF.format(model="Response")}},
            "text/event-stream": {"schema": _SSE_EVENT},
        },
    }
    create = {
        "summary": "Create a response",
        "operationId": "createResponse",
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": _REF.format(model="ResponsesRequest")}}},
        },
        "responses": {"200": ok, **{str(s): error(s) for s in (400, 401, 404, 413, 429, 503, 504)}},
    }
    paths["/v1/responses"] = {"post": create}
    paths["/v1/responses/{response_id}"] = {
        "get": {
            "summary": "A stored response",
            "operationId": "getResponse",
            "parameters": _ID,
            "responses": {"200": _json("the response", "Response"), **{str(s): error(s) for s in (401, 404, 503)}},
        },
        "delete": {
            "summary": "Delete a stored response",
            "operationId": "deleteResponse",
            "parameters": _ID,
            "responses": {
                "200": _json("it is deleted", "ResponseDeleted"),
                **{str(s): error(s) for s in (401, 404, 503)},
            },
        },
    }
    paths["/v1/responses/{response_id}/input_items"] = {
        "get": {
            "summary": "A stored response's input items",
            "operationId": "listInputItems",
            "parameters": _ID + _PAGE,
            "responses": {
                "200": _json("a page of them", "ResponseItemList"),
                **{str(s): error(s) for s in (400, 401, 404, 503)},
            },
        }
    }


def _json(description: str, model: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": {"$ref": _REF.format(model=model)}}}}
