"""Tool calling through /v1/responses on the gateway's chat tool machinery (the Hermes parser), against fake
workers whose scripted tokens are a tool call: function_call items whole and streamed, a function_call_output
continuing the conversation, and an `openai-agents` agent that calls its function tool and then answers."""

import json
from contextlib import asynccontextmanager

import pytest
from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

from tests.unit.services.gateway.conftest import MODEL, REPLY
from tests.unit.services.gateway.test_gateway_responses_api import prompt_text

CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


@asynccontextmanager
async def _tools_stack(stack_with, tmp_path, **kw):
    async with stack_with(response_store_path=str(tmp_path / "responses.sqlite3"), tool_parser="hermes", **kw) as s:
        s.router.max_model_len = 4096  # NOTE: the tools' system prompt alone outgrows the tiny model's 512
        yield s


@pytest.fixture
def tools_stack(stack_with, tmp_path):
    return lambda **kw: _tools_stack(stack_with, tmp_path, **kw)


@pytest.fixture(scope="session")
def call_ids(tokenizer) -> list[int]:
    return tokenizer.encode(CALL_TEXT, add_special_tokens=False)


async def test_a_tool_call_is_a_function_call_item_and_its_output_continues(
    tools_stack, call_ids, reply_ids, tokenizer
):
    async with tools_stack() as s:
        s.decode.tokens = call_ids
        response = await s.client.responses.create(model=MODEL, input="Weather in Paris?", tools=[TOOL])
        [call] = response.output
        assert (call.type, call.name, json.loads(call.arguments)) == ("function_call", "get_weather", {"city": "Paris"})
        assert call.call_id and call.status == "completed" and response.status == "completed"
        assert "get_weather" in prompt_text(s, tokenizer)  # the template rendered the tool for the model
        s.decode.tokens = reply_ids
        answer = await s.client.responses.create(
            model=MODEL,
            previous_response_id=response.id,
            tools=[TOOL],
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 24 C"}],
        )
        assert answer.output_text == REPLY
        prompt = prompt_text(s, tokenizer)
        assert prompt.index("Weather in Paris?") < prompt.index('"Paris"') < prompt.index("sunny, 24 C")


async def test_a_streamed_tool_call_sends_function_call_events(tools_stack, call_ids):
    async with tools_stack() as s:
        s.decode.tokens = call_ids
        stream = await s.client.responses.create(model=MODEL, input="Weather in Paris?", tools=[TOOL], stream=True)
        events = [event async for event in stream]
        kinds = [e.type for e in events]
        num_deltas = kinds.count("response.function_call_arguments.delta")
        assert num_deltas >= 1 and kinds == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            *["response.function_call_arguments.delta"] * num_deltas,
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
        assert [e.sequence_number for e in events] == list(range(len(events)))
        arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        assert json.loads(arguments) == {"city": "Paris"} == json.loads(events[-3].arguments)
        assert events[2].item.type == "function_call" and events[2].item.name == "get_weather"
        [call] = events[-1].response.output
        assert call.call_id == events[2].item.call_id and json.loads(call.arguments) == {"city": "Paris"}


async def test_an_openai_agents_agent_calls_its_tool_then_answers(tools_stack, call_ids, reply_ids, tokenizer):
    set_tracing_disabled(True)  # NOTE: its tracing would export to api.openai.com
    async with tools_stack() as s:
        cities = []

        @function_tool
        def get_weather(city: str) -> str:
            """The weather in a city."""
            cities.append(city)
            s.decode.tokens = reply_ids  # NOTE: the scripted model answers once the tool has run
            return f"sunny in {city}"

        s.decode.tokens = call_ids
        agent = Agent(
            name="forecaster",
            instructions="Use your tools.",
            tools=[get_weather],
            model=OpenAIResponsesModel(model=MODEL, openai_client=s.client),
        )
        result = await Runner.run(agent, "Weather in Paris?")
        assert cities == ["Paris"] and result.final_output == REPLY
        assert "sunny in Paris" in prompt_text(s, tokenizer)
        assert len(s.decode.generate_requests) == 2
