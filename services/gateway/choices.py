"""One request's choices: each is its own worker request through the pipeline, and its token deltas become
text deltas (detokenized, special tokens skipped, stop strings cut). n choices run concurrently.

Knows text and tokens, not HTTP or OpenAI's JSON shapes (responses.py).
"""

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, replace

from transformers import PreTrainedTokenizerBase

from engines.base.types import FinishReason, SamplingParams, TokenLogprob
from services.common.tracing import timed_span
from services.gateway.detokenizer import IncrementalDetokenizer
from services.gateway.pipeline import Pipeline
from services.gateway.stop import StopMatcher

_FINISH = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length"}


@dataclass(frozen=True, slots=True)
class Job:
    """What every choice of one request shares."""

    request_id: str
    prompts: tuple[list[int], ...]  # a completions batch has several: choice i answers prompt i // n
    params: SamplingParams
    n: int = 1
    stop: tuple[str, ...] = ()

    @property
    def prompt(self) -> list[int]:
        return self.prompts[0]

    @property
    def num_choices(self) -> int:
        return len(self.prompts) * self.n

    @property
    def num_prompt_tokens(self) -> int:
        return sum(map(len, self.prompts))


@dataclass(frozen=True, slots=True)
class ChoiceDelta:
    index: int
    text: str
    num_tokens: int  # generated tokens this delta covers (all of them count as usage)
    logprobs: tuple[TokenLogprob, ...] = ()
    finish_reason: str | None = None  # "stop" | "length"
    num_cached_tokens: int | None = None  # on a choice's first delta: prompt tokens found in a prefix cache


OnTokens = Callable[[int, int], None]  # (choice index, number of new tokens)


def run_job(
    pipeline: Pipeline, tokenizer: PreTrainedTokenizerBase, job: Job, on_tokens: OnTokens
) -> AsyncIterator[ChoiceDelta]:
    """Every choice's deltas, interleaved as they come; each choice ends with a finish_reason."""
    streams = [run_choice(pipeline, tokenizer, job, i, on_tokens) for i in range(job.num_choices)]
    return streams[0] if len(streams) == 1 else merge(streams)


async def run_choice(
    pipeline: Pipeline, tokenizer: PreTrainedTokenizerBase, job: Job, index: int, on_tokens: OnTokens
) -> AsyncIterator[ChoiceDelta]:
    prompt = job.prompts[index // job.n]
    detokenizer = IncrementalDetokenizer(tokenizer, prompt)
    stop = StopMatcher(job.stop)
    # NOTE: seeds follow the choice's place among its prompt's n, so a batch answers each prompt as alone
    req_id, params = f"{job.request_id}-{index}", _choice_params(job.params, index % job.n)
    first_ns, busy_s, num_tokens = 0, 0.0, 0  # for the detokenize span: first delta to last, time spent
    try:
        # NOTE: leaving this block early (a stop string, the client gone) closes the stream: the worker aborts
        async with aclosing(pipeline.generate(req_id, prompt, params)) as stream:
            async for delta in stream:
                began = time.perf_counter()
                is_first, first_ns = not first_ns, first_ns or time.time_ns()
                num_tokens += len(delta.token_ids)
                on_tokens(index, len(delta.token_ids))
                text = stop.push(detokenizer.push(delta.token_ids))
                if delta.finish_reason is not None and not stop.is_stopped:
                    text += stop.push(detokenizer.flush())
                    text += stop.flush()
                finish = "stop" if stop.is_stopped else _FINISH.get(delta.finish_reason)
                busy_s += time.perf_counter() - began
                yield ChoiceDelta(
                    index,
                    text,
                    len(delta.token_ids),
                    delta.logprobs,
                    finish,
                    delta.num_cached_tokens if is_first else None,
                )
                if finish is not None:
                    return
    finally:
        if first_ns:
            timed_span(
                "detokenize",
                first_ns,
                time.time_ns(),
                **{"tandem.choice": index, "tandem.tokens": num_tokens, "tandem.busy_s": busy_s},
            )


def _choice_params(params: SamplingParams, index: int) -> SamplingParams:
    # a seeded request stays reproducible, but its n choices must not all be the same sample
    return params if params.seed is None or index == 0 else replace(params, seed=(params.seed + index) % 2**63)


async def merge(streams: list[AsyncIterator[ChoiceDelta]]) -> AsyncIterator[ChoiceDelta]:
    """Interleave streams; the first error cancels the others and is raised."""
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(stream: AsyncIterator[ChoiceDelta]) -> None:
        try:
            async with aclosing(stream):
                async for item in stream:
                    queue.put_nowait(item)
            queue.put_nowait(done)
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, who raises it
            queue.put_nowait(exc)

    tasks = [asyncio.create_task(pump(s)) for s in streams]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()  # their own finally blocks abort their worker requests
