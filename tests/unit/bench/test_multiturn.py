"""The multi-turn workload: histories grow by the real answer and a question, rounds and the barrier, TTFT by round,
the flags, and a whole run against a mocked server."""

import asyncio
import json

import httpx
import numpy as np
import pytest

from tandem.bench.multiturn import (
    QUESTION_TOKENS,
    Conversations,
    Multiturn,
    answers_digest,
    rounds_summary,
    run_conversations,
)
from tandem.bench.serve_bench import config_from_args, run_multiturn
from tandem.bench.serve_report import format_rounds
from tandem.bench.serve_stats import RequestRecord
from tandem.cli import build_parser

ALLOWED = np.arange(100, 400)


def record(ttft: float, text: str = "x", error: str | None = None) -> RequestRecord:
    return RequestRecord(0.0, [] if error else [ttft], end_s=ttft, num_output_tokens=1, text=text, error=error)


def test_every_user_shares_the_system_part_and_has_their_own():
    conv = Conversations(Multiturn(3, 2, system_tokens=40, user_tokens=10, answer_tokens=4), ALLOWED, seed=7)
    prompts = [conv.prompt(conv.spec(u, 0)) for u in range(3)]
    assert [len(p) for p in prompts] == [50] * 3
    assert prompts[0][:40] == prompts[1][:40] == prompts[2][:40]
    assert len({tuple(p[40:]) for p in prompts}) == 3
    again = Conversations(Multiturn(3, 2, 40, 10, 4), ALLOWED, seed=7)
    assert again.prompt(again.spec(1, 0)) == prompts[1]  # deterministic given the seed


def test_a_later_round_resends_the_history_with_the_tokenized_answer_and_a_question():
    conv = Conversations(Multiturn(2, 3, 8, 4, 3), ALLOWED, tokenize=lambda text: [ord(c) for c in text])
    first = conv.spec(1, 0)
    before = conv.prompt(first)
    conv.answer(first, "abc")
    second = conv.spec(1, 1)
    prompt = conv.prompt(second)
    assert prompt[:12] == before and prompt[12:15] == [97, 98, 99]
    assert len(prompt) == 12 + 3 + QUESTION_TOKENS and second.isl == len(prompt)
    assert conv.where(second) == (1, 1) and conv.prompt(conv.spec(0, 0)) != before  # user 0 is untouched


def test_without_a_tokenizer_an_answer_is_a_stand_in_of_answer_tokens():
    conv = Conversations(Multiturn(1, 2, 0, 5, 6), ALLOWED)
    conv.answer(conv.spec(0, 0), "some text")
    assert len(conv.prompt(conv.spec(0, 1))) == 5 + 6 + QUESTION_TOKENS


@pytest.mark.parametrize("barrier", [True, False])
async def test_rounds_run_in_order_per_user_and_the_barrier_holds_a_round_back(barrier):
    mt = Multiturn(3, 3, 4, 4, 2, round_barrier=barrier)
    conv = Conversations(mt, ALLOWED)
    events = []

    async def send(spec):
        user, rnd = conv.where(spec)
        events.append(("start", user, rnd))
        await asyncio.sleep(0.001 * (3 - user))  # user 0 is the slowest
        events.append(("end", user, rnd))
        return record(0.1 * (rnd + 1), text=f"{user}.{rnd}")

    pairs = await run_conversations(conv, send)
    assert sorted(k for k, _ in pairs) == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert conv.answers == [[f"{u}.{r}" for r in range(3)] for u in range(3)]
    last_end_round0 = max(i for i, e in enumerate(events) if e[0] == "end" and e[2] == 0)
    first_start_round1 = min(i for i, e in enumerate(events) if e[0] == "start" and e[2] == 1)
    # with the barrier no round-1 request starts before every round-0 answer; without it, user 2 runs ahead
    assert (first_start_round1 > last_end_round0) is barrier


async def test_qps_spaces_the_starts():
    mt = Multiturn(4, 1, 0, 2, 1, qps=50.0)
    conv = Conversations(mt, ALLOWED)
    loop = asyncio.get_running_loop()
    starts = []

    async def send(spec):
        starts.append(loop.time())
        return record(0.01)

    await run_conversations(conv, send)
    offsets = np.array(sorted(starts)) - min(starts)  # slots 20 ms apart; a late wake-up never moves the next
    assert len(offsets) == 4 and all(offsets[i] >= 0.02 * i - 0.002 for i in range(4))


def test_ttft_by_round_counts_sent_requests_and_averages_the_completed():
    pairs = [(1, record(0.2)), (1, record(0.4)), (2, record(0.1)), (2, record(0.0, error="HTTP 500"))]
    rows = rounds_summary(pairs, 3)
    assert rows[0] == {
        "round": 1,
        "ttft_mean_s": pytest.approx(0.3),
        "ttft_p50_s": pytest.approx(0.3),
        "num_requests": 2,
    }
    assert rows[1]["ttft_mean_s"] == pytest.approx(0.1) and rows[1]["num_requests"] == 2
    assert rows[2]["num_requests"] == 0 and rows[2]["ttft_mean_s"] != rows[2]["ttft_mean_s"]  # NaN
    table = format_rounds(rows)
    assert "300.00" in table.splitlines()[2] and table.splitlines()[4].split()[:2] == ["3", "0"]


def test_the_digest_is_equal_only_for_identical_answers():
    a, b = (Conversations(Multiturn(2, 1, 0, 1, 1), ALLOWED) for _ in range(2))
    for conv, texts in ((a, ["x", "y"]), (b, ["x", "y"])):
        for u, text in enumerate(texts):
            conv.answer(conv.spec(u, 0), text)
    assert answers_digest(a) == answers_digest(b)
    b.answers[1][0] = "z"
    assert answers_digest(a) != answers_digest(b)


def test_flags_become_a_multiturn_config():
    args = build_parser().parse_args(
        [
            "bench",
            "serve",
            "--url",
            "http://h:1",
            "--workload",
            "multiturn",
            "--users",
            "8",
            "--rounds",
            "4",
            "--system-tokens",
            "1000",
            "--user-tokens",
            "1000",
            "--answer-tokens",
            "32",
            "--qps",
            "2",
            "--round-barrier",
        ]
    )
    cfg = config_from_args(args)
    assert cfg.multiturn == Multiturn(8, 4, 1000, 1000, 32, 2.0, True)
    assert cfg.describe_load().startswith("multiturn: 8 users x 4 rounds")


@pytest.mark.parametrize(
    "argv, message",
    [
        (("--users", "0"), "must be >= 1"),
        (("--qps", "0"), "--qps must be > 0"),
        (("--request-rate", "3"), "paces itself"),
    ],
)
def test_bad_multiturn_flags_are_refused(argv, message):
    args = build_parser().parse_args(["bench", "serve", "--url", "http://h:1", "--workload", "multiturn", *argv])
    with pytest.raises(ValueError, match=message):
        config_from_args(args)


async def test_a_whole_run_against_a_mocked_server_reports_rounds_and_answers(monkeypatch):
    bodies = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m", "max_model_len": 4096}]})
        body = json.loads(request.content)
        bodies.append(body)
        text = f"<{len(body['prompt'])}>"
        chunks = [{"choices": [{"index": 0, "text": text, "finish_reason": "length"}]}, "[DONE]"]
        payload = b"".join(
            b"data: " + (c.encode() if isinstance(c, str) else json.dumps(c).encode()) + b"\n\n" for c in chunks
        )
        return httpx.Response(200, content=payload)

    real_client = httpx.AsyncClient
    monkeypatch.setattr(
        httpx, "AsyncClient", lambda **kw: real_client(**{**kw, "transport": httpx.MockTransport(handler)})
    )
    args = build_parser().parse_args(
        [
            "bench",
            "serve",
            "--url",
            "http://h:1",
            "--workload",
            "multiturn",
            "--users",
            "2",
            "--rounds",
            "3",
            "--system-tokens",
            "10",
            "--user-tokens",
            "5",
            "--answer-tokens",
            "4",
            "--round-barrier",
        ]
    )
    summary, report = await run_multiturn(config_from_args(args), config_from_args(args).multiturn)
    assert summary.num_completed == 6 and [r["num_requests"] for r in report["rounds"]] == [2, 2, 2]
    assert sorted(len(b["prompt"]) for b in bodies) == [15, 15, 51, 51, 87, 87]  # + 4 stand-in ids + 32 asked
    assert report["answers"] == [["<15>", "<51>", "<87>"]] * 2 and len(report["answers_sha256"]) == 64
    assert all(b["max_tokens"] == 4 for b in bodies)
