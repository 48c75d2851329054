"""The relay-ratio bench scripts on CPU: the call-cost microbenchmark at a tiny size over plaintext and mutual TLS
(real echo server, real certificates), and the rounds summary's pairing and per-token arithmetic."""

import json

from bench import grpc_call_cost, overhead_rounds_summary


def test_the_call_cost_bench_measures_both_kinds_over_plaintext_and_mtls(tmp_path):
    grpc_call_cost.write_certs(tmp_path)
    for certs in ("", str(tmp_path)):
        result = grpc_call_cost.run_mode(certs, calls=64, messages=2048)
        assert set(result) == {
            f"{kind}_{side}_us" for kind in ("unary", "stream") for side in ("client", "server", "wall")
        }
        assert all(value > 0 for value in result.values()), result


def phase(rnd: int, is_plaintext: bool, tokens: int, cpu_s: float) -> dict:
    return {
        "security_round": rnd,
        "is_plaintext": is_plaintext,
        "cpu_s": dict.fromkeys(overhead_rounds_summary.SERVICES, cpu_s) | {"client": 9.0},
        "summary": {"num_output_tokens": tokens, "output_tokens_per_s": 1.0, "num_errors": 0},
    }


def test_rounds_pair_secure_with_baseline_and_cpu_is_per_token(tmp_path):
    path = tmp_path / "rounds.json"
    path.write_text(
        json.dumps({"phases": [phase(-1, False, 1, 1.0), phase(0, True, 1000, 0.002), phase(0, False, 1000, 0.003)]})
    )
    ((secure, baseline),) = overhead_rounds_summary.pairs([str(path)])
    assert (secure["is_plaintext"], baseline["is_plaintext"]) == (False, True)
    per_token = overhead_rounds_summary.per_token(secure)
    assert per_token["router"] == 3.0 and per_token["stack"] == 12.0  # the client is not the stack
