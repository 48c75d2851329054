"""Real clients of /v1/responses against live stacks serving the real SmolLM2, aggregated and disaggregated (every
prompt prefilled on the prefill worker): the `openai` SDK
(whole, streamed, and a conversation continued by previous_response_id) and the `openai-agents` SDK (which calls
the Responses API by default) get, token for token, what the chat endpoint answers for the same conversation;
forced tool calls and `text.format` json_schema come back valid against their schemas (the grammar), and an agent
calls its function tool."""

import json

import jsonschema
import openai
import pytest
from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

from tandem.launcher import served_name
from tests.integration.conftest import running_stack

pytestmark = pytest.mark.slow
MAX_TOKENS = 24
QUESTION, FOLLOW_UP = "What is the capital of France?", "And what is the capital of Italy?"


@pytest.fixture(scope="module", params=["aggregated", "disaggregated"])
def stack(smollm2_dir, tmp_path_factory, request):
    work = tmp_path_factory.mktemp(f"responses-{request.param}")
    env = {"TANDEM_ROUTER_DISAGG_MIN_TOKENS": "1", "TANDEM_RESPONSE_STORE_PATH": str(work / "responses.sqlite3")}
    num_prefill = 1 if request.param == "disaggregated" else 0
    with running_stack(smollm2_dir, work, num_prefill=num_prefill, num_decode=1, env=env) as running:
        yield running


@pytest.fixture
async def client(stack):
    async with openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def model(smollm2_dir) -> str:
    return served_name(str(smollm2_dir))


async def chat_answer(client, model: str, messages: list[dict]) -> str:
    reply = await client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_completion_tokens=MAX_TOKENS
    )
    return reply.choices[0].message.content


async def test_a_conversation_continued_by_previous_response_id_answers_as_chat_does(client, model):
    first = await client.responses.create(
        model=model, input=QUESTION, instructions="Answer in one sentence.", temperature=0, max_output_tokens=MAX_TOKENS
    )
    assert "Paris" in first.output_text
    system = {"role": "system", "content": "Answer in one sentence."}
    assert first.output_text == await chat_answer(client, model, [system, {"role": "user", "content": QUESTION}])
    second = await client.responses.create(
        model=model, input=FOLLOW_UP, previous_response_id=first.id, temperature=0, max_output_tokens=MAX_TOKENS
    )
    history = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": FOLLOW_UP},
    ]  # NOTE: instructions are not carried over
    assert second.output_text == await chat_answer(client, model, history)
    assert second.previous_response_id == first.id


async def test_streaming_gives_the_same_answer_with_openais_events(client, model):
    whole = await client.responses.create(model=model, input=QUESTION, temperature=0, max_output_tokens=MAX_TOKENS)
    kinds = []
    async with client.responses.stream(
        model=model, input=QUESTION, temperature=0, max_output_tokens=MAX_TOKENS
    ) as stream:
        async for event in stream:
            kinds.append(event.type)
        final = await stream.get_final_response()
    assert final.output_text == whole.output_text and final.status == whole.status
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert (await client.responses.retrieve(final.id)).output_text == final.output_text


async def test_an_openai_agents_agent_runs_against_tandem(client, model):
    set_tracing_disabled(True)  # NOTE: its tracing would export to api.openai.com
    agent = Agent(
        name="geographer",
        instructions="Answer in one sentence.",
        model=OpenAIResponsesModel(model=model, openai_client=client),
        model_settings=ModelSettings(temperature=0, max_tokens=MAX_TOKENS),
    )
    result = await Runner.run(agent, QUESTION)
    system = {"role": "system", "content": "Answer in one sentence."}
    assert result.final_output == await chat_answer(client, model, [system, {"role": "user", "content": QUESTION}])
    assert "Paris" in result.final_output


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
PLACE = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 40}, "country": {"type": "string", "maxLength": 40}},
    "required": ["city", "country"],
    "additionalProperties": False,
}


async def test_tool_choice_required_gives_calls_that_validate(client, model):
    response = await client.responses.create(
        model=model,
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice="required",
        temperature=0,
        max_output_tokens=200,
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls and response.status == "completed"
    for call in calls:
        assert call.name == "get_weather" and call.call_id
        jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])


async def test_text_format_json_schema_gives_an_object_that_validates(client, model):
    fmt = {"type": "json_schema", "name": "place", "schema": PLACE, "strict": True}
    response = await client.responses.create(
        model=model, input="Name a city and its country.", temperature=0, text={"format": fmt}, max_output_tokens=200
    )
    assert response.status == "completed" and response.text.format.type == "json_schema"
    jsonschema.validate(json.loads(response.output_text), PLACE)


async def test_an_openai_agents_agent_calls_its_function_tool(client, model):
    set_tracing_disabled(True)
    cities = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        cities.append(city)
        return f"sunny in {city}"

    agent = Agent(
        name="forecaster",
        instructions="Use your tools.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model=model, openai_client=client),
        tool_use_behavior="stop_on_first_tool",
        model_settings=ModelSettings(temperature=0, tool_choice="required", max_tokens=200),
    )
    result = await Runner.run(agent, "What is the weather in Paris?")
    assert len(cities) >= 1 and result.final_output == f"sunny in {cities[0]}"
