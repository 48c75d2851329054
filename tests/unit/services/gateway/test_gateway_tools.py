"""Tool parsers, the choice splitter (content / reasoning / tool calls, whole and streamed) and the chat plan:
exact outputs for each format, streaming that never leaks a marker into content, and grammars that compile."""

import json

import llguidance
import pytest

from engines.base.grammar import grammar_text
from services.gateway.chat_output import ChoiceSplitter, split_message
from services.gateway.chat_plan import plan_chat
from services.gateway.errors import InvalidRequestError
from services.gateway.openai_protocol import ChatCompletionRequest, parse_request
from services.gateway.tool_parsers import HermesParser, Llama3JsonParser, MistralParser, ParsedCall, parser_for

ARGS = '{"city": "Paris"}'
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}},
    },
}
SMOL_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def chat(**fields) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return parse_request(ChatCompletionRequest, json.dumps(body).encode())


@pytest.mark.parametrize("parser", [HermesParser(), Llama3JsonParser(), MistralParser()])
def test_each_parser_reads_back_what_it_renders(parser):
    text = parser.render_call("get_weather", ARGS)
    assert parser.parse(text) == ("", [ParsedCall("get_weather", ARGS)])
    assert parser.parse("just words") == ("just words", [])


def test_hermes_keeps_content_before_calls_and_reads_several():
    p = HermesParser()
    text = "Let me check.\n" + p.render_call("a", "{}") + "\n" + p.render_call("b", '{"x": 1}')
    assert p.parse(text) == ("Let me check.", [ParsedCall("a", "{}"), ParsedCall("b", '{"x": 1}')])
    assert p.parse("<tool_call>\n{not json\n</tool_call>")[1] == []  # broken calls stay content
    tricky = p.render_call("a", '{"s": "x}</tool_call>y"}')  # the closing tag inside a string
    assert p.parse(tricky)[1] == [ParsedCall("a", '{"s": "x}</tool_call>y"}')]


def test_llama3_reads_semicolon_separated_calls():
    text = '{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"y": 2}}'
    assert Llama3JsonParser().parse(text)[1] == [ParsedCall("a", "{}"), ParsedCall("b", '{"y": 2}')]


def test_parser_follows_the_template_or_the_flag():
    assert isinstance(parser_for("auto", "{{ '[TOOL_CALLS]' }}"), MistralParser)
    assert isinstance(parser_for("auto", "<|python_tag|>"), Llama3JsonParser)
    assert isinstance(parser_for("auto", SMOL_TEMPLATE), HermesParser)
    assert isinstance(parser_for("mistral", SMOL_TEMPLATE), MistralParser)
    with pytest.raises(InvalidRequestError):
        parser_for("nope", None)


def _stream(splitter: ChoiceSplitter, pieces: list[str]):
    parts = [splitter.feed(p) for p in pieces]
    tail, reason = splitter.finish("stop")
    return parts + [tail], reason


def test_streamed_calls_never_leak_the_marker_into_content():
    call = HermesParser().render_call("get_weather", ARGS)
    pieces = ["Sure", ". <tool", '_call>\n{"name": ', call[len('<tool_call>\n{"name": ') :]]
    parts, reason = _stream(ChoiceSplitter(HermesParser(), False), pieces)
    assert "".join(p.content for p in parts) == "Sure. " and reason == "tool_calls"
    head, args = parts[-1].tool_calls
    assert head["function"] == {"name": "get_weather", "arguments": ""} and head["id"].startswith("call_")
    assert args == {"index": 0, "function": {"arguments": ARGS}}
    message = split_message(parts, "Sure. ")
    assert message["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": ARGS}


def test_reasoning_is_split_off_then_content_follows():
    parts, reason = _stream(ChoiceSplitter(None, True), ["<thi", "nk>Let me ", "think.</th", "ink>\n\nHello", "!"])
    assert "".join(p.reasoning for p in parts) == "Let me think."
    assert "".join(p.content for p in parts) == "Hello!" and reason == "stop"
    started, _ = _stream(ChoiceSplitter(None, True, starts_in_reasoning=True), ["hmm</think>ok"])
    assert ("".join(p.reasoning for p in started), "".join(p.content for p in started)) == ("hmm", "ok")
    plain, _ = _stream(ChoiceSplitter(None, True), ["no thinking here"])
    assert "".join(p.content for p in plain) == "no thinking here"
    later, _ = _stream(ChoiceSplitter(None, True), ["<think>hm</think>", "\n", "\n", "no", " more"])
    assert "".join(p.content for p in later) == "no more"  # the blank after </think> goes, in whatever chunks


def test_reasoning_then_a_tool_call():
    call = HermesParser().render_call("get_weather", ARGS)
    parts, reason = _stream(ChoiceSplitter(HermesParser(), True), ["<think>weather?</think>", call])
    assert "".join(p.reasoning for p in parts) == "weather?" and reason == "tool_calls"


def test_plan_forces_calls_by_a_grammar_that_compiles_and_accepts_a_call():
    plan = plan_chat(chat(tools=[TOOL], tool_choice="required"), SMOL_TEMPLATE, HermesParser(), False)
    assert plan.spec.field == "tool_choice" and plan.tools is None  # SmolLM2-like: tools go in a system prompt
    assert plan.messages[0]["role"] == "system" and "get_weather" in plan.messages[0]["content"]
    grammar = grammar_text(plan.spec)
    assert llguidance.LLMatcher.validate_grammar_with_warnings(grammar)[0] is False
    named = plan_chat(
        chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}}),
        SMOL_TEMPLATE,
        HermesParser(),
        False,
    )
    assert "get_weather" in named.spec.value
    assert plan_chat(chat(tools=[TOOL]), SMOL_TEMPLATE, HermesParser(), False).spec is None  # auto: free
    none = plan_chat(chat(tools=[TOOL], tool_choice="none"), SMOL_TEMPLATE, HermesParser(), False)
    assert none.parser is None and none.messages == [{"role": "user", "content": "hi"}]


def test_history_with_calls_and_results_renders_as_text_for_templates_without_tools():
    messages = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ARGS}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "21C"},
    ]
    plan = plan_chat(chat(messages=messages, tools=[TOOL]), SMOL_TEMPLATE, HermesParser(), False)
    assert plan.messages[2] == {"role": "assistant", "content": HermesParser().render_call("get_weather", ARGS)}
    assert plan.messages[3] == {"role": "user", "content": "<tool_response>\n21C\n</tool_response>"}
    native = plan_chat(chat(messages=messages, tools=[TOOL]), "{{ tools }}", HermesParser(), False)
    assert native.tools and native.messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "other"}}}, "tool_choice"),
        ({"tools": [TOOL, TOOL]}, "tools"),
        ({"structured_outputs": {"regex": "[a-"}}, "structured_outputs"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"response_format": {"type": "json_object"}, "structured_outputs": {"choice": ["a"]}}, "structured_outputs"),
    ],
)
def test_bad_combinations_are_400s_naming_the_field(fields, param):
    with pytest.raises(InvalidRequestError) as info:
        plan_chat(chat(**fields), SMOL_TEMPLATE, HermesParser(), False)
    assert info.value.param == param


def test_response_formats_become_specs_that_wrap_after_reasoning():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    req = chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert json.loads(req.format_spec().value) == schema
    plan = plan_chat(req, SMOL_TEMPLATE, HermesParser(), True)
    assert plan.spec.kind == "grammar" and grammar_text(plan.spec)
    assert chat(response_format={"type": "text"}).format_spec() is None
    assert chat(structured_outputs={"choice": ["y", "n"]}).format_spec().kind == "choice"


def test_the_grammar_after_reasoning_holds_from_the_first_close_tag(model_dir):
    """The reasoning is free up to its first </think>; from there only the answer's grammar is allowed."""
    from tokenizers import Tokenizer

    plan = plan_chat(chat(structured_outputs={"choice": ["yes", "no"]}), SMOL_TEMPLATE, HermesParser(), True)
    text = (model_dir / "tokenizer.json").read_text()
    tokenizer = llguidance.LLTokenizer(text)

    def accepts(*pieces: str) -> bool:
        matcher = llguidance.LLMatcher(tokenizer, grammar_text(plan.spec))
        ids = [i for piece in pieces for i in Tokenizer.from_str(text).encode(piece, add_special_tokens=False).ids]
        return matcher.consume_tokens(ids) and not matcher.is_error()

    assert accepts("<think>", "so < and </thing> and </thin", "ker> are fine</think>", "\n", "yes")
    assert not accepts("<think>", "hm</think>", "\n", "Paris")  # free text after the close tag
    assert not accepts("<think>", "hm</think>", "yes", "</think>")
    assert not accepts("Paris")  # the reasoning opens first


@pytest.mark.parametrize("parser", [HermesParser(), Llama3JsonParser(), MistralParser()])
def test_a_forced_call_after_reasoning(parser, model_dir):
    """A forced call's grammar (the gateway's own) follows </think>; a client's Lark grammar is still refused."""
    from tokenizers import Tokenizer

    plan = plan_chat(chat(tools=[TOOL], tool_choice="required"), SMOL_TEMPLATE, parser, True)
    text = (model_dir / "tokenizer.json").read_text()
    matcher = llguidance.LLMatcher(llguidance.LLTokenizer(text), grammar_text(plan.spec))
    call = parser.render_call("get_weather", ARGS).strip().replace('": ', '":').replace(', "', ',"')  # compact JSON
    output = "<think>a tool, then</think>\n" + call
    assert matcher.consume_tokens(Tokenizer.from_str(text).encode(output, add_special_tokens=False).ids)
    assert not matcher.is_error() and matcher.is_accepting()
    with pytest.raises(InvalidRequestError, match="reasoning") as info:
        plan_chat(chat(structured_outputs={"grammar": 'start: "a"'}), SMOL_TEMPLATE, parser, True)
    assert info.value.param == "structured_outputs"
