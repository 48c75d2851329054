"""Properties over generated inputs (hypothesis): request parsing answers any body with a request or a 400, never
another exception; stop strings and the detokenizer give the same text however the token stream is cut into
deltas (a migrated stream arrives in other pieces than an unbroken one); an SSE event carries its payload whole."""

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.gateway.detokenizer import IncrementalDetokenizer
from services.gateway.errors import status_of
from services.gateway.openai_protocol import ChatCompletionRequest, CompletionRequest, parse_request
from services.gateway.sse import event
from services.gateway.stop import StopMatcher

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
FIELDS = sorted(set(CompletionRequest.model_fields) | set(ChatCompletionRequest.model_fields))
BODIES = st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=8)
KNOBS = {
    "max_tokens": st.none() | st.integers(1, 64) | st.integers(-5, 10**7),
    "min_tokens": st.integers(-5, 100),
    "temperature": st.floats(0, 2) | st.floats(-1, 5),
    "top_p": st.floats(0.01, 1) | st.floats(-1, 2),
    "top_k": st.integers(-3, 100),
    "n": st.just(1) | st.integers(-1, 3),
    "seed": st.integers(-(2**70), 2**70),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "ignore_eos": st.booleans(),
    "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=6),
    "logprobs": st.booleans(),
}
PROMPTS = {
    "prompt": st.text(max_size=20) | st.lists(st.integers(-5, 60000), max_size=20),
    "messages": st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "system", "assistant", "x"]), "content": st.text(max_size=20)}
        ),
        min_size=1,
        max_size=3,
    ),
}


def near_valid(kind, prompt: str):
    """Bodies close to valid: a model, a prompt, and knobs within and past their limits."""
    body = st.fixed_dictionaries(
        {"model": st.text(max_size=5), prompt: PROMPTS[prompt]},
        optional={k: v for k, v in KNOBS.items() if k in kind.model_fields},
    )
    return st.tuples(st.just(kind), body)


REQUESTS = (
    near_valid(CompletionRequest, "prompt")
    | near_valid(ChatCompletionRequest, "messages")
    | st.tuples(st.sampled_from([CompletionRequest, ChatCompletionRequest]), BODIES | JSON)
)
SAMPLE_PARAMS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def cuts(n: int):
    """Sorted cut points splitting a sequence of length n into pieces."""
    return st.lists(st.integers(0, n), max_size=8).map(sorted)


def pieces(seq, points):
    bounds = [0, *points, len(seq)]
    return [seq[a:b] for a, b in zip(bounds, bounds[1:])]


@SAMPLE_PARAMS
@given(request=REQUESTS, raw=st.booleans(), junk=st.binary(max_size=40))
def test_any_body_parses_or_is_a_clean_400(request, raw, junk):
    kind, body = request
    data = junk if raw else json.dumps(body).encode()
    try:
        req = parse_request(kind, data)
    except Exception as exc:  # noqa: BLE001 - the property: whatever it raises is a 400 with a message
        assert status_of(exc) == 400 and str(exc)
        return
    max_tokens = req.requested_max_tokens() or max(req.min_tokens, 16)
    try:
        req.sampling_params(max_tokens)  # what the pipeline builds next: valid, or a 400 too
    except Exception as exc:  # noqa: BLE001
        assert status_of(exc) == 400 and str(exc)


TEXT = st.text(alphabet="ab \n😀中", max_size=40)


@SAMPLE_PARAMS
@given(data=st.data(), text=TEXT, stops=st.lists(st.text(alphabet="ab \n😀中", min_size=1, max_size=4), max_size=3))
def test_stop_strings_cut_at_the_earliest_stop_however_the_text_arrives(data, text, stops):
    matcher = StopMatcher(stops)
    out = [matcher.push(p) for p in pieces(text, data.draw(cuts(len(text))))]
    out.append(matcher.flush())
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    assert "".join(out) == (text[: min(hits)] if hits else text)
    assert matcher.is_stopped == bool(hits)


@SAMPLE_PARAMS
@given(data=st.data(), text=st.text(alphabet="héllo wörld 😀👍🏽 中文字 \n", max_size=30))
def test_detokenized_text_does_not_depend_on_how_tokens_are_grouped(tokenizer, data, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer)
    out = [detok.push(p) for p in pieces(ids, data.draw(cuts(len(ids))))]
    out.append(detok.flush())
    assert "".join(out) == tokenizer.decode(ids)
    assert not any("\ufffd" in d for d in out[:-1])


@SAMPLE_PARAMS
@given(payload=JSON)
def test_an_sse_event_carries_one_json_payload_whole(payload):
    frame = event(json.dumps(payload).encode())
    assert frame.startswith(b"data: ") and frame.endswith(b"\n\n") and frame.count(b"\n") == 2
    assert json.loads(frame[len(b"data: ") : -2]) == payload
