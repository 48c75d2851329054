"""The Responses API's answers: the `response` object, whole from a chat completion or as OpenAI's stream events
(response.created ... response.completed, each with its sequence_number) from chat completion chunks.
Pure functions and one state machine per stream; what the JSON looks like and nothing else."""

import time

from services.gateway import responses_items as items
from services.gateway.responses_protocol import ResponsesRequest


def envelope(req: ResponsesRequest, response_id: str, created_at: float) -> dict:
    """The response object as it starts: everything the request fixes, no output yet."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": req.model,
        "output": [],
        "parallel_tool_calls": req.parallel_tool_calls,
        "previous_response_id": req.previous_response_id,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "tool_choice": req.tool_choice if isinstance(req.tool_choice, str) else req.tool_choice.model_dump(),
        "tools": [t.model_dump(exclude_none=True) | {"strict": t.strict} for t in req.tools],
        "text": {"format": req.text.format.model_dump(by_alias=True, exclude_none=True)},
        "truncation": "disabled",
        "store": req.store,
        "metadata": req.metadata or {},
        "user": req.user,
        "usage": None,
    }


def whole(start: dict, chat: dict) -> dict:
    """The finished response from a whole chat completion."""
    choice = chat["choices"][0]
    status, details = items.outcome(choice.get("finish_reason"))
    output = items.output_items(choice["message"], "incomplete" if details else "completed")
    return start | {
        "status": status,
        "incomplete_details": details,
        "output": output,
        "usage": items.usage(chat.get("usage")),
        "completed_at": time.time(),
    }


class EventStream:
    """Chat completion chunks in, Responses stream events out. Reasoning (`reasoning_content`) opens a reasoning
    item, text a message item (each with its one part); each tool call its own function_call item. An item is
    closed when the next one opens or the response ends."""

    def __init__(self, start: dict):
        self.response = start
        self._seq = 0
        self._text_item: dict | None = None  # the open message item
        self._calls: dict[int, dict] = {}  # the chat tool call's index -> its open function_call item
        self._finish_reason: str | None = None

    def _event(self, kind: str, **fields) -> dict:
        event = {"type": kind, **fields, "sequence_number": self._seq}
        self._seq += 1
        return event

    def _snapshot(self) -> dict:
        return dict(self.response, output=list(self.response["output"]))

    def start(self) -> list[dict]:
        return [
            self._event("response.created", response=self._snapshot()),
            self._event("response.in_progress", response=self._snapshot()),
        ]

    def on_chunk(self, chunk: dict) -> list[dict]:
        events: list[dict] = []
        if chunk.get("usage"):
            self.response["usage"] = items.usage(chunk["usage"])
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                events += self._text("reasoning", delta["reasoning_content"])
            if delta.get("content"):
                events += self._text("message", delta["content"])
            for call in delta.get("tool_calls") or ():
                events += self._call(call)
            self._finish_reason = choice.get("finish_reason") or self._finish_reason
        return events

    def finish(self) -> list[dict]:
        """Close what is open, then response.completed (or response.incomplete at max_output_tokens)."""
        status, details = items.outcome(self._finish_reason)
        events = self._close_text("incomplete" if details else "completed") + self._close_calls()
        self.response |= {"status": status, "incomplete_details": details, "completed_at": time.time()}
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return events + [self._event(kind, response=self._snapshot())]

    def fail(self, error: dict) -> list[dict]:
        """The stream broke after it started: the response failed with the gateway's error."""
        self.response |= {
            "status": "failed",
            "error": {"code": error.get("code") or "server_error", "message": error.get("message", "internal error")},
        }
        return [self._event("response.failed", response=self._snapshot())]

    def _open(self, item: dict) -> tuple[int, dict]:
        self.response["output"].append(item)
        index = len(self.response["output"]) - 1
        return index, self._event("response.output_item.added", output_index=index, item=dict(item))

    def _text(self, kind: str, text: str) -> list[dict]:
        """A piece of the answer (kind "message") or of the reasoning before it (kind "reasoning")."""
        events = []
        if self._text_item is None or self._text_item["type"] != kind:
            events += self._close_text("completed") + self._close_calls()
            item = items.message_item("", "in_progress") if kind == "message" else items.reasoning_item("")
            part = item["content"].pop()
            index, added = self._open(item)
            self._text_item = item
            events += [
                added,
                self._event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part=dict(part),
                ),
            ]
            item["content"].append(part)
        item, index = self._text_item, self.response["output"].index(self._text_item)
        item["content"][0]["text"] += text
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        if kind == "reasoning":
            return events + [self._event("response.reasoning_text.delta", **where, delta=text)]
        return events + [self._event("response.output_text.delta", **where, delta=text, logprobs=[])]

    def _close_text(self, status: str) -> list[dict]:
        item, self._text_item = self._text_item, None
        if item is None:
            return []
        index, part = self.response["output"].index(item), item["content"][0]
        item["status"] = status
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        if item["type"] == "reasoning":
            done = self._event("response.reasoning_text.done", **where, text=part["text"])
        else:
            done = self._event("response.output_text.done", **where, text=part["text"], logprobs=[])
        return [
            done,
            self._event("response.content_part.done", **where, part=dict(part)),
            self._event("response.output_item.done", output_index=index, item=dict(item)),
        ]

    def _call(self, call: dict) -> list[dict]:
        events, function = [], call.get("function") or {}
        item = self._calls.get(call.get("index", 0))
        if item is None:
            events += self._close_text("completed") + self._close_calls()
            item = items.call_item(call.get("id") or items.new_id("call"), function.get("name", ""), "", "in_progress")
            self._calls[call.get("index", 0)] = item
            events.append(self._open(item)[1])
        if function.get("arguments"):
            item["arguments"] += function["arguments"]
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=self.response["output"].index(item),
                    delta=function["arguments"],
                )
            )
        return events

    def _close_calls(self) -> list[dict]:
        events = []
        for item in self._calls.values():
            index = self.response["output"].index(item)
            item["status"] = "completed"
            events += [
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=item["arguments"],
                ),
                self._event("response.output_item.done", output_index=index, item=dict(item)),
            ]
        self._calls.clear()
        return events
