"""/v1/responses against the gateway on fake workers, through the official `openai` client: whole and streamed
answers in OpenAI's shapes and event order, previous_response_id replaying the stored conversation into the chat
prompt, retrieve and delete, owners kept apart, and clear 400s/404s for what is wrong or absent."""

import openai
import pytest

from tests.integration.helpers import assert_error
from tests.unit.services.gateway.conftest import MODEL, REPLY

TEXT_EVENTS = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
CLOSE_EVENTS = [
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


@pytest.fixture
def responses_stack(stack_with, tmp_path):
    return lambda **kw: stack_with(response_store_path=str(tmp_path / "responses.sqlite3"), **kw)


def prompt_text(stack, tokenizer, n: int = -1) -> str:
    return tokenizer.decode(stack.decode.generate_requests[n].token_ids)


async def test_a_response_is_the_chat_answer_in_the_responses_shape(responses_stack, tokenizer):
    async with responses_stack() as s:
        response = await s.client.responses.create(model=MODEL, input="Say hello.", instructions="Be brief.")
        assert response.status == "completed" and response.output_text == REPLY
        assert response.id.startswith("resp_") and response.object == "response" and response.model == MODEL
        [item] = response.output
        assert item.type == "message" and item.role == "assistant" and item.status == "completed"
        assert [p.type for p in item.content] == ["output_text"]
        prompt = prompt_text(s, tokenizer)
        assert prompt.index("Be brief.") < prompt.index("Say hello.")  # instructions: the system message
        # NOTE: the logs and the workers know the request by the id the client holds, not an inner chatcmpl one
        assert s.decode.generate_requests[-1].req_id == f"{response.id}-0"
        usage = response.usage
        assert usage.input_tokens == len(s.decode.generate_requests[-1].token_ids)
        assert (
            usage.output_tokens == len(s.decode.tokens)
            and usage.total_tokens == usage.input_tokens + usage.output_tokens
        )


async def test_a_streamed_response_sends_openais_events_in_order(responses_stack):
    async with responses_stack() as s:
        stream = await s.client.responses.create(model=MODEL, input="Say hello.", stream=True)
        events = [event async for event in stream]
        kinds = [e.type for e in events]
        num_deltas = kinds.count("response.output_text.delta")
        assert kinds == TEXT_EVENTS + ["response.output_text.delta"] * num_deltas + CLOSE_EVENTS
        assert [e.sequence_number for e in events] == list(range(len(events)))
        deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
        assert "".join(deltas) == REPLY and events[-4].text == REPLY
        final = events[-1].response
        assert final.status == "completed" and final.output_text == REPLY and final.usage.output_tokens > 0
        assert (await s.client.responses.retrieve(final.id)).output_text == REPLY
        assert s.decode.generate_requests[-1].req_id == f"{final.id}-0"


async def test_the_sdk_stream_helper_accumulates_the_final_response(responses_stack):
    async with responses_stack() as s:
        async with s.client.responses.stream(model=MODEL, input="Say hello.") as stream:
            async for _ in stream:
                pass
            final = await stream.get_final_response()
        assert final.output_text == REPLY and final.status == "completed"


async def test_previous_response_id_continues_the_conversation(responses_stack, tokenizer):
    async with responses_stack() as s:
        first = await s.client.responses.create(model=MODEL, input="My name is Ada.", instructions="Be brief.")
        second = await s.client.responses.create(model=MODEL, input="What is my name?", previous_response_id=first.id)
        assert second.previous_response_id == first.id and second.instructions is None
        prompt = prompt_text(s, tokenizer)
        assert "Be brief." not in prompt  # NOTE: instructions are not carried over, as OpenAI's are not
        assert prompt.index("My name is Ada.") < prompt.index(REPLY) < prompt.index("What is my name?")
        third = await s.client.responses.create(model=MODEL, input="And again?", previous_response_id=second.id)
        assert prompt_text(s, tokenizer).count(REPLY) == 2 and third.status == "completed"


async def test_retrieve_and_delete(responses_stack):
    async with responses_stack() as s:
        response = await s.client.responses.create(model=MODEL, input="Hi")
        assert (await s.client.responses.retrieve(response.id)).model_dump() == response.model_dump()
        deleted = await s.http.delete(f"/v1/responses/{response.id}")
        assert deleted.json() == {"id": response.id, "object": "response.deleted", "deleted": True}
        assert_error(
            await s.http.get(f"/v1/responses/{response.id}"), 404, type="invalid_request_error", code="not_found"
        )
        assert_error(
            await s.http.delete(f"/v1/responses/{response.id}"), 404, type="invalid_request_error", code="not_found"
        )
        reply = await s.http.post(
            "/v1/responses", json={"model": MODEL, "input": "x", "previous_response_id": response.id}
        )
        assert_error(reply, 404, type="invalid_request_error", code="not_found", param="previous_response_id")


async def test_store_false_keeps_nothing(responses_stack):
    async with responses_stack() as s:
        response = await s.client.responses.create(model=MODEL, input="Hi", store=False)
        assert response.output_text == REPLY and response.store is False
        assert_error(
            await s.http.get(f"/v1/responses/{response.id}"), 404, type="invalid_request_error", code="not_found"
        )


async def test_another_keys_response_is_not_found(responses_stack):
    async with responses_stack(api_keys=("key-a", "key-b")) as s:
        response = await s.client.responses.create(model=MODEL, input="Hi")
        other = {"authorization": "Bearer key-b"}
        assert_error(
            await s.http.get(f"/v1/responses/{response.id}", headers=other),
            404,
            type="invalid_request_error",
            code="not_found",
        )
        assert_error(
            await s.http.delete(f"/v1/responses/{response.id}", headers=other),
            404,
            type="invalid_request_error",
            code="not_found",
        )
        body = {"model": MODEL, "input": "x", "previous_response_id": response.id}
        assert_error(
            await s.http.post("/v1/responses", json=body, headers=other),
            404,
            type="invalid_request_error",
            code="not_found",
            param="previous_response_id",
        )
        assert (await s.client.responses.retrieve(response.id)).id == response.id  # its own key still reads it
        assert (await s.http.get(f"/v1/responses/{response.id}")).status_code == 401


async def test_max_output_tokens_makes_an_incomplete_response(responses_stack):
    async with responses_stack() as s:
        response = await s.client.responses.create(model=MODEL, input="Hi", max_output_tokens=2)
        assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
        assert response.usage.output_tokens == 2 and response.output[0].status == "incomplete"
        events = [
            e async for e in await s.client.responses.create(model=MODEL, input="Hi", max_output_tokens=2, stream=True)
        ]
        assert events[-1].type == "response.incomplete" and events[-1].response.status == "incomplete"


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({"reasoning": {"effort": "high"}}, "reasoning", "not supported"),
        ({"frobnicate": 1}, "frobnicate", "Unrecognized"),
        ({"input": [{"type": "image_generation_call", "id": "x"}]}, "input", "image_generation_call"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input", "input[0]"),
        ({"tool_choice": {"type": "function", "name": "nope"}}, "tool_choice", "no tools"),
        ({"text": {"format": {"type": "json_schema"}}}, "text", "name and a schema"),
        ({"max_output_tokens": 0}, "max_output_tokens", "max_output_tokens"),
        ({"tools": [{"type": "web_search"}]}, "tools", "tools"),
    ],
)
async def test_bad_requests_are_a_400_naming_the_field(responses_stack, body, param, words):
    async with responses_stack() as s:
        reply = await s.http.post("/v1/responses", json={"model": MODEL, "input": "Hi", **body})
        err = assert_error(reply, 400, type="invalid_request_error", param=param)
        assert words in err["message"]


async def test_an_unknown_model_is_a_404(responses_stack):
    async with responses_stack() as s:
        with pytest.raises(openai.NotFoundError):
            await s.client.responses.create(model="other", input="Hi")


async def test_a_client_that_leaves_mid_stream_cancels_the_work(responses_stack):
    async with responses_stack() as s:
        s.decode.hang_after = 2  # two tokens, then the worker waits until it is cancelled
        body = {"model": MODEL, "input": "Hi", "stream": True}
        async with s.http.stream("POST", "/v1/responses", json=body) as reply:
            assert reply.status_code == 200
            lines = reply.aiter_lines()
            seen = [line async for line in _until(lines, "response.output_text.delta")]
            assert '"response.created"' in seen[0]
        await s.wait_for(lambda: len(s.decode.cancelled) == 1)
        await s.wait_until_idle()


async def _until(lines, kind: str):
    async for line in lines:
        yield line
        if kind in line:
            return


async def test_a_failure_before_the_first_token_keeps_its_http_status(responses_stack):
    import grpc

    async with responses_stack() as s:
        s.router.route_error = grpc.StatusCode.RESOURCE_EXHAUSTED
        reply = await s.http.post("/v1/responses", json={"model": MODEL, "input": "Hi", "stream": True})
        assert_error(reply, 503, type="service_unavailable_error", code="workers_busy", retry_after="1")
        await s.wait_until_idle()


async def test_a_worker_failing_mid_stream_fails_the_response(responses_stack):
    async with responses_stack(max_migrations=0) as s:
        s.decode.engine_error_after = 2
        stream = await s.client.responses.create(model=MODEL, input="Hi", stream=True)
        events = [event async for event in stream]
        assert events[-1].type == "response.failed" and events[-1].response.status == "failed"
        assert events[-1].response.error.message and events[-2].type == "response.output_text.delta"
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert_error(
            await s.http.get(f"/v1/responses/{events[0].response.id}"),
            404,
            type="invalid_request_error",
            code="not_found",
        )  # a failed response is not stored


async def test_an_openai_agents_agent_streams_and_continues_a_conversation(responses_stack, tokenizer):
    from agents import Agent, OpenAIResponsesModel, Runner, set_tracing_disabled

    set_tracing_disabled(True)  # NOTE: its tracing would export to api.openai.com
    async with responses_stack() as s:
        agent = Agent(
            name="a", instructions="Be brief.", model=OpenAIResponsesModel(model=MODEL, openai_client=s.client)
        )
        streamed = Runner.run_streamed(agent, "Hi there")
        kinds = {event.type async for event in streamed.stream_events()}
        assert streamed.final_output == REPLY and "raw_response_event" in kinds
        first = await Runner.run(agent, "My name is Ada.")
        second = await Runner.run(agent, "What is my name?", previous_response_id=first.last_response_id)
        assert second.final_output == REPLY
        prompt = prompt_text(s, tokenizer)
        assert prompt.index("My name is Ada.") < prompt.index(REPLY) < prompt.index("What is my name?")


async def test_input_items_list_what_the_response_was_given(responses_stack):
    async with responses_stack() as s:
        given = [
            {"role": "user", "content": "Weather?"},
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_1",
                "content": [{"type": "output_text", "text": "Sunny.", "annotations": []}],
            },
            {"role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
        ]
        reply = await s.http.post("/v1/responses", json={"model": MODEL, "input": given})
        response_id = reply.json()["id"]
        listed = await s.client.responses.input_items.list(response_id, order="asc")
        assert [(item.type, item.role) for item in listed.data] == [("message", g["role"]) for g in given]
        assert listed.data[0].content[0].text == "Weather?" and listed.data[0].content[0].type == "input_text"
        assert listed.data[1].id == "msg_1" and listed.data[1].content[0].text == "Sunny."
        assert all(item.id for item in listed.data)
        newest = (await s.http.get(f"/v1/responses/{response_id}/input_items", params={"limit": 1})).json()
        assert newest["data"][0]["id"] == listed.data[-1].id and newest["has_more"] is True
        rest = (
            await s.http.get(
                f"/v1/responses/{response_id}/input_items", params={"limit": 100, "after": newest["last_id"]}
            )
        ).json()
        assert [i["id"] for i in rest["data"]] == [i.id for i in listed.data[-2::-1]] and rest["has_more"] is False
        for params, param in (
            ({"limit": 0}, "limit"),
            ({"order": "up"}, "order"),
            ({"after": "x"}, "after"),
            ({"page": 2}, "page"),
        ):
            assert_error(
                await s.http.get(f"/v1/responses/{response_id}/input_items", params=params),
                400,
                type="invalid_request_error",
                param=param,
            )
        assert_error(
            await s.http.get("/v1/responses/resp_none/input_items"), 404, type="invalid_request_error", code="not_found"
        )


async def test_responses_are_counted_under_their_route_refused_or_not(responses_stack):
    async with responses_stack() as s:
        await s.client.responses.create(model=MODEL, input="Hi")
        await s.http.post("/v1/responses", json={"model": MODEL, "input": "Hi", "reasoning": {"effort": "low"}})
        await s.http.post("/v1/responses", json={"model": MODEL, "input": "Hi", "frobnicate": 1})
        text = (await s.http.get("/metrics")).text
        for status, count in (("200", 1), ("400", 2)):
            line = f'tandem_gateway_requests_total{{model="{MODEL}",route="/v1/responses",status="{status}"}}'
            assert f"{line} {count}.0" in text, text
        await s.wait_until_idle()
