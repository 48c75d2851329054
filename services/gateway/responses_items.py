"""Responses API items to and from chat messages: input items (and a stored conversation's output) become the chat
messages the gateway templates; a chat completion's message becomes output items. Pure: no I/O."""

import uuid

from services.gateway.errors import InvalidRequestError
from services.gateway.responses_protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputItem,
    MessageItem,
    parse_item,
)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def chat_messages(items: list[InputItem]) -> list[dict]:
    """The chat messages `items` say, in order; function calls join the assistant message before them (one
    assistant turn may call several tools), a function's output becomes a `tool` message."""
    messages: list[dict] = []
    for item in items:
        if isinstance(item, MessageItem):
            messages.append({"role": item.role, "content": item.text()})
        elif isinstance(item, FunctionCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text()})
        # NOTE: a reasoning item sent back is dropped, as chat templates drop earlier turns' reasoning
    return messages


def output_messages(output: list[dict]) -> list[dict]:
    """A response's output items as the chat messages a continuation (previous_response_id) replays."""
    return chat_messages([parse_item(i, item) for i, item in enumerate(output)])


_ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}
MAX_PAGE = 100


def input_records(items: list[InputItem]) -> list[dict]:
    """`items` as `GET /v1/responses/{id}/input_items` lists them: each with an id, a message's text as a part."""
    records = []
    for item in items:
        record = item.model_dump(exclude_none=True) | {"id": item.id or new_id(_ID_PREFIXES[item.type])}
        if isinstance(item, MessageItem) and isinstance(item.content, str):
            kind = "output_text" if item.role == "assistant" else "input_text"
            record["content"] = [{"type": kind, "text": item.content}]
        records.append(record)
    return records


def page(records: list[dict], order: str = "desc", limit: int = 20, after: str | None = None) -> dict:
    """One page of a list, as OpenAI pages them: newest first unless `order` is asc, from after the item `after`."""
    ordered = records if order == "asc" else records[::-1]
    start = 0
    if after is not None:
        ids = [r["id"] for r in ordered]
        if after not in ids:
            raise InvalidRequestError(f"no item `{after}` in this list", param="after")
        start = ids.index(after) + 1
    data = ordered[start : start + limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": start + limit < len(ordered),
    }


def page_query(query: dict[str, str]) -> dict:
    """The paging arguments of a query string, or a 400 naming the one that is wrong (or unknown)."""
    for name in query:
        if name not in ("order", "limit", "after"):
            raise InvalidRequestError(f"Unrecognized query parameter: {name}", param=name)
    out: dict = {"order": query.get("order", "desc"), "after": query.get("after")}
    if out["order"] not in ("asc", "desc"):
        raise InvalidRequestError("order must be asc or desc", param="order")
    limit = query.get("limit", "20")
    if not limit.isdigit() or not 1 <= int(limit) <= MAX_PAGE:
        raise InvalidRequestError(f"limit must be an integer in [1, {MAX_PAGE}]", param="limit")
    return out | {"limit": int(limit)}


def message_item(text: str, status: str, item_id: str | None = None) -> dict:
    return {
        "id": item_id or new_id("msg"),
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [text_part(text)],
    }


def reasoning_item(text: str, status: str = "in_progress") -> dict:
    return {
        "id": new_id("rs"),
        "type": "reasoning",
        "status": status,
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    }


def text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(call_id: str, name: str, arguments: str, status: str, item_id: str | None = None) -> dict:
    return {
        "id": item_id or new_id("fc"),
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def output_items(message: dict, status: str) -> list[dict]:
    """A whole chat completion's message as output items: its reasoning and its text (when it has any), then each
    tool call."""
    items = []
    if message.get("reasoning_content"):  # NOTE: cut short only when nothing came after it, as a stream closes it
        is_last = not (message.get("content") or message.get("tool_calls"))
        items.append(reasoning_item(message["reasoning_content"], status if is_last else "completed"))
    if message.get("content"):
        items.append(message_item(message["content"], status))
    for call in message.get("tool_calls") or ():
        function = call["function"]
        items.append(call_item(call.get("id") or new_id("call"), function["name"], function["arguments"], "completed"))
    return items


def usage(chat_usage: dict | None) -> dict | None:
    if chat_usage is None:
        return None
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {
        "input_tokens": chat_usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": chat_usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": chat_usage["total_tokens"],
    }


def outcome(finish_reason: str | None) -> tuple[str, dict | None]:
    """The response's status and incomplete_details for the chat choice's finish reason."""
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    return "completed", None
