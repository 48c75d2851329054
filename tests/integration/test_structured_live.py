"""Structured outputs and tool calling against live stacks serving the real SmolLM2, aggregated and disaggregated
(every request prefilled on a prefill worker whose first token obeys the grammar, and resumed on a decode worker),
through real clients: the `openai` SDK (a tool-calling loop, parse() into a pydantic model, streamed tool calls) and
`instructor`. A sim stack refuses a structured request by the field's name."""

import json

import instructor
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tandem.launcher import served_name
from tests.integration.conftest import running_stack

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["city", "unit"],
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "required": ["timezone"],
            "properties": {"timezone": {"type": "string", "maxLength": 40}},
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]


class City(BaseModel):
    # NOTE: bounded, so that a 135M model's answer ends: unbounded, greedy SmolLM2 writes 1111... for good
    # and non-empty: instructor samples (temperature 1), and the grammar must then hold the schema's minLength too
    name: str = Field(min_length=1, max_length=40)
    country: str = Field(min_length=1, max_length=40)
    population: int = Field(ge=0, le=10**9)


@pytest.fixture(scope="module", params=["aggregated", "disaggregated"])
def stack(request, smollm2_dir, tmp_path_factory):
    num_prefill = 1 if request.param == "disaggregated" else 0
    with running_stack(
        smollm2_dir,
        tmp_path_factory.mktemp(request.param),
        num_prefill=num_prefill,
        num_decode=1,
        env={"TANDEM_ROUTER_DISAGG_MIN_TOKENS": "1"},
    ) as running:
        yield running


@pytest.fixture(scope="module")
def client(stack):
    with openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0, timeout=180) as c:
        yield c


@pytest.fixture(scope="module")
def model(smollm2_dir) -> str:
    return served_name(str(smollm2_dir))


def _valid_call(call, tool: dict) -> dict:
    assert call.type == "function" and call.id and call.function.name == tool["function"]["name"]
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, tool["function"]["parameters"])
    return arguments


def test_tool_loop_call_result_answer(client, model):
    first = client.chat.completions.create(
        model=model,
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=80,
        temperature=0.7,
        seed=5,
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    tool = WEATHER if call.function.name == "get_weather" else TIME
    _valid_call(call, tool)
    history = ASK + [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 21})},
    ]
    answer = client.chat.completions.create(
        model=model, messages=history, tools=[WEATHER, TIME], max_tokens=40, temperature=0
    )
    message = answer.choices[0].message
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert message.content or message.tool_calls
    assert answer.usage.prompt_tokens > first.usage.prompt_tokens  # the call and its result were rendered


def test_named_function_streams_as_openai_does(client, model):
    stream = client.chat.completions.create(
        model=model,
        messages=ASK,
        tools=[WEATHER, TIME],
        max_tokens=80,
        stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    deltas, finishes = [], []
    for chunk in stream:
        for c in chunk.choices:
            deltas += c.delta.tool_calls or []
            finishes.append(c.finish_reason)
    assert finishes[-1] == "tool_calls"
    head, rest = deltas[0], deltas[1:]
    assert head.index == 0 and head.id and head.type == "function" and head.function.name == "get_weather"
    assert head.function.arguments == "" and all(d.index == 0 and d.id is None for d in rest)
    arguments = json.loads("".join(d.function.arguments for d in rest))
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])


def test_parse_returns_a_valid_pydantic_object(client, model):
    completion = client.chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": "Describe the city of Paris."}],
        response_format=City,
        max_tokens=80,
        temperature=0,
    )
    city = completion.choices[0].message.parsed
    assert isinstance(city, City) and city.name


def test_instructor_extracts_a_typed_object(client, model):
    patched = instructor.from_openai(client, mode=instructor.Mode.TOOLS)
    city = patched.chat.completions.create(
        model=model,
        response_model=City,
        max_retries=0,
        max_tokens=80,
        messages=[{"role": "user", "content": "Tell me about Lyon, France."}],
    )
    assert isinstance(city, City) and city.name


def test_structured_outputs_choice_and_regex(client, model):
    def ask(content: str, **extra):
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": content}], max_tokens=30, temperature=0, **extra
        )
        return reply.choices[0].message.content

    assert ask("Is the sky blue?", extra_body={"structured_outputs": {"choice": ["yes", "no"]}}) in ("yes", "no")
    phone = ask("Give me a phone number.", extra_body={"structured_outputs": {"regex": r"\d{3}-\d{4}"}})
    assert len(phone) == 8 and phone[3] == "-" and (phone[:3] + phone[4:]).isdigit()


def test_bad_grammar_and_bad_tool_choice_are_400s(client, model):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model, messages=ASK, extra_body={"structured_outputs": {"regex": "[0-"}})
    assert info.value.param == "structured_outputs"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=model, messages=ASK, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}
        )
    assert info.value.param == "tool_choice"


def test_sim_engine_refuses_by_the_fields_name(tiny_stack_model, tmp_path):
    with (
        running_stack(tiny_stack_model, tmp_path, engine="sim", num_prefill=0) as sim,
        openai.OpenAI(base_url=f"{sim.url}/v1", api_key="unused", max_retries=0, timeout=60) as c,
    ):
        name = served_name(str(tiny_stack_model))
        with pytest.raises(openai.BadRequestError) as info:
            c.chat.completions.create(model=name, messages=ASK, response_format={"type": "json_object"})
        # NOTE: the worker refuses it (only it knows its engine): its 400 names the field in the message
        assert "`response_format`" in info.value.message and "does not constrain" in info.value.message
        with pytest.raises(openai.BadRequestError) as info:
            c.chat.completions.create(model=name, messages=ASK, tools=[WEATHER], tool_choice="required")
        assert "`tool_choice`" in info.value.message
