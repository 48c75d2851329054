"""SSE line parsing of OpenAI streams: completions, chat, usage, [DONE], errors, and what to ignore."""

import json

from tandem.bench.sse import EventKind, SseEvent, parse_sse_line


def data(payload) -> str:
    return "data: " + json.dumps(payload)


def test_completion_chunk_gives_text_and_finish_reason():
    line = data({"object": "text_completion", "choices": [{"index": 0, "text": "Par", "finish_reason": None}]})
    assert parse_sse_line(line) == SseEvent(EventKind.CONTENT, text="Par")
    last = data({"choices": [{"index": 0, "text": "is", "finish_reason": "length"}]})
    assert parse_sse_line(last) == SseEvent(EventKind.CONTENT, text="is", finish_reason="length")


def test_chat_chunks_read_the_delta_and_a_role_only_chunk_has_no_text():
    role = data({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
    assert parse_sse_line(role) == SseEvent(EventKind.CONTENT, text="")
    content = data({"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}]})
    assert parse_sse_line(content).text == "Hi"
    null_content = data({"choices": [{"index": 0, "delta": {"content": None}, "finish_reason": "stop"}]})
    assert parse_sse_line(null_content) == SseEvent(EventKind.CONTENT, text="", finish_reason="stop")


def test_usage_chunk_and_usage_on_a_content_chunk():
    usage = data({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9}})
    assert parse_sse_line(usage) == SseEvent(EventKind.USAGE, num_completion_tokens=5)
    both = data({"choices": [{"text": "x", "finish_reason": "length"}], "usage": {"completion_tokens": 7}})
    assert parse_sse_line(both).num_completion_tokens == 7
    assert parse_sse_line(data({"choices": [], "usage": None})).kind is EventKind.OTHER


def test_done_with_or_without_the_space():
    assert parse_sse_line("data: [DONE]").kind is EventKind.DONE
    assert parse_sse_line("data:[DONE]").kind is EventKind.DONE


def test_error_events_carry_the_message():
    event = parse_sse_line(data({"error": {"message": "worker lost", "type": "server_error"}}))
    assert event == SseEvent(EventKind.ERROR, error="worker lost")
    assert parse_sse_line(data({"error": "plain"})).error == "plain"
    assert parse_sse_line("data: {not json").kind is EventKind.ERROR
    assert parse_sse_line("data: [1, 2]").kind is EventKind.ERROR


def test_blank_lines_comments_and_other_fields_are_ignored():
    for line in ("", ": ping - 2024-01-01", "event: message", "id: 3", "retry: 1000"):
        assert parse_sse_line(line).kind is EventKind.OTHER
