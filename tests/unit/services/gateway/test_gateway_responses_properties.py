"""Properties of /v1/responses over generated inputs (hypothesis): any body parses to a request and a chat
request or is a 400, never another exception; and however a chat stream cuts its reasoning, text and tool calls
into chunks, the Responses events number themselves 0, 1, 2 ..., open and close every item once, and end in the
same output a whole chat completion of the same message gives."""

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.gateway.errors import status_of
from services.gateway.responses_items import chat_messages
from services.gateway.responses_output import EventStream, envelope, whole
from services.gateway.responses_protocol import ResponsesRequest, parse_responses_request

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=10,
)
ITEM = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["message", "function_call", "function_call_output", "input_image"])
        | st.text(max_size=4),
        "role": st.sampled_from(["user", "assistant", "system", "developer", "tool"]),
        "content": st.text(max_size=5) | JSON,
        "call_id": st.text(max_size=3),
        "name": st.text(max_size=3),
        "arguments": st.text(max_size=3),
        "output": st.text(max_size=3) | JSON,
    },
)
BODIES = st.fixed_dictionaries(
    {"model": st.text(max_size=3)},
    optional={
        "input": st.text(max_size=5) | st.lists(ITEM, max_size=4) | JSON,
        "instructions": st.text(max_size=3) | JSON,
        "tools": st.lists(
            st.fixed_dictionaries({"type": st.just("function"), "name": st.text(max_size=3)}), max_size=2
        ),
        "tool_choice": st.sampled_from(["auto", "none", "required"])
        | st.fixed_dictionaries({"type": st.just("function"), "name": st.text(max_size=3)})
        | JSON,
        "text": st.fixed_dictionaries(
            {
                "format": st.fixed_dictionaries(
                    {"type": st.sampled_from(["text", "json_object", "json_schema", "grammar"])},
                    optional={"name": st.text(max_size=3), "schema": JSON},
                )
            }
        ),
        "max_output_tokens": st.integers(-2, 10**12),
        "temperature": st.floats(-1, 3),
        "stream": st.booleans(),
        "store": st.booleans() | JSON,
        "reasoning": JSON,
        "include": JSON,
    },
) | st.dictionaries(st.sampled_from(sorted(ResponsesRequest.model_fields)), JSON, max_size=6)
SAMPLE_PARAMS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SAMPLE_PARAMS
@given(BODIES)
def test_any_body_is_a_request_or_a_400(body):
    try:
        req = parse_responses_request(json.dumps(body).encode())
        json.loads(req.chat_body(chat_messages(req.input_items())))
    except Exception as exc:  # noqa: BLE001 (the property: whatever it is, it is a 400)
        assert status_of(exc) == 400, repr(exc)


def _cuts(draw, text: str) -> list[str]:
    points = sorted(draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=4))) if len(text) > 1 else []
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)]) if text[a:b]]


@st.composite
def chat_streams(draw):
    """A chat message (text and/or tool calls) and the chunks a stream of it might arrive in."""
    reasoning, text = draw(st.text(max_size=12)), draw(st.text(max_size=12))
    calls = draw(st.lists(st.tuples(st.sampled_from(["f", "g"]), st.text(max_size=10)), max_size=3))
    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]
    for key, value in (("reasoning_content", reasoning), ("content", text)):
        chunks += [
            {"choices": [{"index": 0, "delta": {key: piece}, "finish_reason": None}]} for piece in _cuts(draw, value)
        ]
    for i, (name, arguments) in enumerate(calls):
        head = {"index": i, "id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": ""}}
        chunks.append({"choices": [{"index": 0, "delta": {"tool_calls": [head]}, "finish_reason": None}]})
        chunks += [
            {
                "choices": [
                    {
                        "index": 0,
                        "delta": {"tool_calls": [{"index": i, "function": {"arguments": p}}]},
                        "finish_reason": None,
                    }
                ]
            }
            for p in _cuts(draw, arguments)
        ]
    finish = draw(st.sampled_from(["stop", "length"] if not calls else ["tool_calls"]))
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    tool_calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
        for i, (n, a) in enumerate(calls)
    ]
    message = {
        "role": "assistant",
        "content": text or None,
        "reasoning_content": reasoning or None,
        "tool_calls": tool_calls,
    }
    return message, finish, chunks


def _without_ids(output: list[dict]) -> list[dict]:
    return [{k: v for k, v in item.items() if k != "id"} for item in output]


@SAMPLE_PARAMS
@given(chat_streams())
def test_a_stream_in_any_pieces_ends_as_the_whole_answer(case):
    message, finish, chunks = case
    req = parse_responses_request(b'{"model": "m", "input": "hi"}')
    stream = EventStream(envelope(req, "resp_1", 1.0))
    events = stream.start()
    for chunk in chunks:
        events += stream.on_chunk(chunk)
    events += stream.finish()
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    added = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    done = [e["output_index"] for e in events if e["type"] == "response.output_item.done"]
    assert added == done == list(range(len(events[-1]["response"]["output"])))
    expected = whole(envelope(req, "resp_1", 1.0), {"choices": [{"message": message, "finish_reason": finish}]})
    assert _without_ids(events[-1]["response"]["output"]) == _without_ids(expected["output"])
    assert events[-1]["response"]["status"] == expected["status"]
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == (message["content"] or "")
    thought = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    assert thought == (message["reasoning_content"] or "")
