"""The grammar-cost benchmark's pure parts: the schema it sends, the request variants, the ratios and the mask cost
per token from two readings of the workers' counters."""

import dataclasses
import json
import math

import llguidance

from tandem.bench.http_client import Endpoint
from tandem.bench.serve_bench import ServeConfig
from tandem.bench.structured_bench import (
    GRAMMAR_COUNTERS,
    format_structured,
    mask_costs,
    ratios,
    round_order,
    round_ratios,
    story_schema,
    with_schema,
)


def test_the_story_schema_compiles_and_cannot_end_within_osl_tokens():
    schema = story_schema(64)
    assert schema["properties"]["story"]["minLength"] == 1024
    grammar = llguidance.grammar_from("json_schema", json.dumps(schema))
    assert not llguidance.LLMatcher.validate_grammar_with_warnings(grammar)[0]


def test_variants_differ_only_by_the_schema_and_make_osl_tokens():
    cfg = ServeConfig(Endpoint("http://x", extra_body={"top_k": 5}), request_rate=2.0)
    plain, constrained = with_schema(cfg, None, 16), with_schema(cfg, {"type": "object"}, 16)
    assert plain.endpoint.extra_body == {"ignore_eos": True, "top_k": 5}
    assert constrained.endpoint.extra_body == plain.endpoint.extra_body | {
        "structured_outputs": {"json": {"type": "object"}}
    }
    assert (plain.concurrency, plain.request_rate, constrained.concurrency) == (16, None, 16)
    small = dataclasses.replace(cfg, num_requests=4)
    assert with_schema(small, None, 16).num_requests == 16 and with_schema(small, None, 1).num_requests == 4


def test_rounds_alternate_which_side_goes_first():
    assert [round_order(i) for i in range(4)] == [(False, True), (True, False), (False, True), (True, False)]


def test_mask_cost_per_token_from_two_readings():
    before = dict(zip(GRAMMAR_COUNTERS, (100, 1.0, 0.5)))
    after = dict(zip(GRAMMAR_COUNTERS, (300, 1.2, 0.54)))
    got = mask_costs(before, after)
    assert got["num_masks"] == 200
    assert math.isclose(got["mask_s_per_token"], 0.001) and math.isclose(got["wait_s_per_token"], 0.0002)
    assert math.isnan(mask_costs(before, before)["mask_s_per_token"])


def test_ratios_and_the_table():
    rows = [
        {
            "concurrency": c,
            "json_schema": js,
            "itl_p50_s": v,
            "num_completed": 4,
            "itl_p90_s": v,
            "mean_itl_p50_s": v,
            "output_tokens_per_s": 10.0,
        }
        for c, js, v in ((1, False, 0.1), (1, True, 0.105), (16, False, 0.2), (16, True, 0.3))
    ]
    got = ratios(rows)
    assert math.isclose(got["1"], 1.05) and math.isclose(got["16"], 1.5)
    text = format_structured({"rows": rows, "ratios": got})
    assert "concurrency 1: ITL p50 ratio 1.050 (meets <= 1.1)" in text
    assert "concurrency 16: ITL p50 ratio 1.500 (misses <= 1.1)" in text


def test_the_ratio_is_of_the_rounds_medians_and_each_round_has_its_own():
    p50s = {(0, False): 0.10, (0, True): 0.11, (1, True): 0.30, (1, False): 0.20, (2, False): 0.12, (2, True): 0.12}
    rows = [
        {
            "concurrency": 1,
            "round": i,
            "json_schema": js,
            "itl_p50_s": v,
            "num_completed": 2,
            "itl_p90_s": v,
            "mean_itl_p50_s": v,
            "output_tokens_per_s": 1.0,
        }
        for (i, js), v in p50s.items()
    ]
    assert math.isclose(ratios(rows)["1"], 0.12 / 0.12)  # medians: 0.12 plain, 0.12 json_schema
    assert [round(v, 3) for v in round_ratios(rows)["1"]] == [1.1, 1.5, 1.0]
    text = format_structured({"rows": rows, "ratios": ratios(rows), "round_ratios": round_ratios(rows)})
    assert "concurrency 1: ITL p50 ratio 1.000 (meets <= 1.1); per round 1.100, 1.500, 1.000" in text
