"""The Responses API's pure mapping onto chat: input items to chat messages (function calls joining their assistant
turn, outputs as tool messages), tools, tool_choice and text.format to the chat request, and chat chunks carrying
text and tool calls to OpenAI's stream events, exactly."""

import json

from services.gateway import responses_items as items
from services.gateway.responses_output import EventStream, envelope, whole
from services.gateway.responses_protocol import parse_responses_request

TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": True,
}


def request(**body):
    return parse_responses_request(json.dumps({"model": "m", "input": "hi", **body}).encode())


def test_input_items_become_chat_messages():
    req = request(
        input=[
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_1",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Let me look.", "annotations": [], "logprobs": []}],
            },
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
            {
                "type": "function_call",
                "call_id": "call_2",
                "name": "get_weather",
                "arguments": '{"city":"Rome"}',
                "id": "fc_2",
                "status": "completed",
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "rain"}]},
            {"role": "developer", "content": [{"type": "input_text", "text": "Answer in one line."}]},
        ]
    )
    assert items.chat_messages(req.input_items()) == [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "rain"},
        {"role": "developer", "content": "Answer in one line."},
    ]


def test_a_function_call_with_no_text_before_it_opens_its_own_assistant_turn():
    req = request(input=[{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}])
    assert items.chat_messages(req.input_items()) == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        }
    ]


def test_tools_tool_choice_and_text_format_map_to_the_chat_request():
    req = request(
        tools=[TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=False,
        max_output_tokens=7,
        temperature=0.5,
        stream=True,
        text={"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": True}},
    )
    body = json.loads(req.chat_body([{"role": "user", "content": "hi"}]))
    assert body == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_completion_tokens": 7,
        "temperature": 0.5,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "w", "schema": {"type": "object"}, "strict": True},
        },
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "The weather in a city",
                    "parameters": TOOL["parameters"],
                    "strict": True,
                },
            }
        ],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": False,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert json.loads(request(text={"format": {"type": "json_object"}}).chat_body([]))["response_format"] == {
        "type": "json_object"
    }
    assert "response_format" not in json.loads(request(text={"format": {"type": "text"}}).chat_body([]))


def _chunk(delta: dict | None = None, finish: str | None = None, usage: dict | None = None) -> dict:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"choices": choices} | ({"usage": usage} if usage else {})


def test_streamed_text_then_tool_calls_become_items_in_order():
    stream = EventStream(envelope(request(tools=[TOOL]), "resp_1", 1.0))
    events = stream.start()
    chunks = [
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"content": "Look"}),
        _chunk({"content": "ing"}),
        _chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ]
            }
        ),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
        _chunk(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "call_b",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'},
                    }
                ]
            }
        ),
        _chunk({}, "tool_calls"),
        _chunk(usage={"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}),
    ]
    for chunk in chunks:
        events += stream.on_chunk(chunk)
    events += stream.finish()
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    final = events[-1]["response"]
    assert (
        final["status"] == "completed" and final["usage"]["input_tokens"] == 5 and final["usage"]["output_tokens"] == 9
    )
    text, first, second = final["output"]
    assert text["content"][0]["text"] == "Looking" and text["status"] == "completed"
    assert (first["call_id"], first["name"], first["arguments"]) == ("call_a", "get_weather", '{"city":"Paris"}')
    assert second["call_id"] == "call_b" and second["arguments"] == '{"city":"Rome"}'
    assert events[12]["arguments"] == '{"city":"Paris"}' and events[12]["output_index"] == 1
    assert events[14]["item"]["status"] == "in_progress" and events[14]["output_index"] == 2


def test_a_whole_completion_with_tool_calls_becomes_function_call_items():
    chat = {
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_a",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                        }
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    }
    response = whole(envelope(request(tools=[TOOL]), "resp_1", 1.0), chat)
    [call] = response["output"]
    assert call["type"] == "function_call" and call["call_id"] == "call_a" and call["status"] == "completed"
    assert response["status"] == "completed" and response["usage"]["total_tokens"] == 7
    assert response["tools"] == [TOOL]
    assert items.output_messages(response["output"]) == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        }
    ]


def test_a_stream_that_breaks_fails_the_response():
    stream = EventStream(envelope(request(), "resp_1", 1.0))
    stream.start()
    stream.on_chunk(_chunk({"content": "Hel"}))
    [failed] = stream.fail({"message": "worker died", "type": "service_unavailable_error", "code": "worker_failed"})
    assert failed["type"] == "response.failed" and failed["sequence_number"] == 5
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"] == {"code": "worker_failed", "message": "worker died"}


def test_reasoning_streams_as_a_reasoning_item_before_the_answer():
    stream = EventStream(envelope(request(), "resp_1", 1.0))
    events = stream.start()
    for delta in ({"reasoning_content": "Think"}, {"reasoning_content": "ing."}, {"content": "Paris."}):
        events += stream.on_chunk(_chunk(delta))
    events += stream.on_chunk(_chunk({}, "stop")) + stream.finish()
    assert [e["type"] for e in events[2:]] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[3]["part"] == {"type": "reasoning_text", "text": ""}
    reasoning, answer = events[-1]["response"]["output"]
    assert reasoning["type"] == "reasoning" and reasoning["content"] == [
        {"type": "reasoning_text", "text": "Thinking."}
    ]
    assert answer["content"][0]["text"] == "Paris."
    chat = {
        "choices": [
            {
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "Paris.", "reasoning_content": "Thinking."},
            }
        ]
    }
    assert [i["type"] for i in whole(envelope(request(), "r", 1.0), chat)["output"]] == ["reasoning", "message"]


def test_a_reasoning_item_sent_back_is_accepted_and_left_out_of_the_prompt():
    req = request(
        input=[
            {"role": "user", "content": "Capital of France?"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Hmm."}]},
            {"type": "message", "role": "assistant", "content": "Paris."},
        ]
    )
    assert items.chat_messages(req.input_items()) == [
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris."},
    ]


def test_input_records_give_every_item_an_id_and_text_as_parts():
    req = request(
        input=[
            {"role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", "id": "fc_9"},
            {"type": "function_call_output", "call_id": "c", "output": "ok"},
        ]
    )
    user, call, result = items.input_records(req.input_items())
    assert user["id"].startswith("msg_") and user["content"] == [{"type": "input_text", "text": "hi"}]
    assert call == {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", "id": "fc_9"}
    assert result["id"].startswith("fco_") and result["output"] == "ok"
    records = [{"id": str(i)} for i in range(5)]
    assert items.page(records, limit=2) == {
        "object": "list",
        "data": [{"id": "4"}, {"id": "3"}],
        "first_id": "4",
        "last_id": "3",
        "has_more": True,
    }
    assert [r["id"] for r in items.page(records, "asc", 10, after="2")["data"]] == ["3", "4"]


def test_cache_salt_travels_to_the_chat_request():
    assert json.loads(request(cache_salt="team-x").chat_body([]))["cache_salt"] == "team-x"
    assert "cache_salt" not in json.loads(request().chat_body([]))
