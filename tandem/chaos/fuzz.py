"""Fuzzing a live gateway against its own OpenAPI document (/openapi.json) with schemathesis: valid and invalid
requests generated from the schema, each answer held to it — never a 5xx, only documented statuses, each with its
documented body (an OpenAI-style error object for every 4xx), headers (Retry-After on 429/503) and content type.

Generation and checks only; which stack it runs against is the caller's.
"""

import logging
from collections import Counter
from dataclasses import dataclass, field

import hypothesis
from hypothesis import HealthCheck, Phase, given

log = logging.getLogger(__name__)
TIMEOUT_S = 60.0  # one answer; a fuzzed request may ask for a long completion
MAX_FAILURES_KEPT = 20
SMALL_OP_SHARE = 5  # cases for an operation without a body (GET /health, /v1/models/{name}, ...)


@dataclass(slots=True)
class FuzzResult:
    cases: int = 0
    statuses: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    num_failures: int = 0

    def record(self, status: int | None, failure: str | None) -> None:
        self.cases += 1
        self.statuses[str(status) if status is not None else "none"] += 1
        if failure is not None:
            self.num_failures += 1
            if len(self.failures) < MAX_FAILURES_KEPT:
                self.failures.append(failure)


def fuzz(base_url: str, cases: int, seed: int = 0) -> FuzzResult:
    """About `cases` requests (fewer where the schema allows fewer distinct ones). A body is a third valid and
    naming the served model (so that it reaches the workers), a third valid with any model, a third invalid."""
    import schemathesis
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    model = _served_model(base_url)
    operations = [op.ok() for op in schema.get_all_operations()]
    result = FuzzResult()
    for op in operations:
        if not op.body:
            _fuzz_operation(op.as_strategy(), SMALL_OP_SHARE, base_url, seed, result)
    heavy = [op for op in operations if op.body]
    n = -(-max(cases - result.cases, len(heavy)) // len(heavy))  # the rest of the budget
    for op in heavy:
        served = op.as_strategy().map(lambda case: _with_model(case, model))
        for strategy in (served, op.as_strategy(), op.as_strategy(generation_mode=GenerationMode.NEGATIVE)):
            _fuzz_operation(strategy, -(-n // 3), base_url, seed, result)
    return result


def _served_model(base_url: str) -> str:
    import httpx

    return httpx.get(f"{base_url}/v1/models", timeout=TIMEOUT_S).json()["data"][0]["id"]


def _with_model(case, model: str):
    if isinstance(case.body, dict):
        case.body = {**case.body, "model": model}
    return case


def _fuzz_operation(strategy, n: int, base_url: str, seed: int, result: FuzzResult) -> None:
    @hypothesis.seed(seed)
    @hypothesis.settings(
        max_examples=n, deadline=None, database=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck)
    )
    @given(strategy)
    def one(case) -> None:
        status, failure = _call(case, base_url)
        result.record(status, failure)

    one()


def _call(case, base_url: str) -> tuple[int | None, str | None]:
    from schemathesis.checks import (
        content_type_conformance,
        not_a_server_error,
        response_headers_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    try:
        response = case.call(base_url=base_url, timeout=TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - a transport failure is a finding, not a crash of the fuzzer
        return None, f"{case.method} {case.path}: no answer ({type(exc).__name__}: {exc})"
    try:
        case.validate_response(
            response,
            checks=[
                not_a_server_error,
                status_code_conformance,
                content_type_conformance,
                response_headers_conformance,
                response_schema_conformance,
            ],
        )
    except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001 - schemathesis' FailureGroup: keep its text
        body = case.body if isinstance(case.body, (dict, list, str)) else type(case.body).__name__
        return response.status_code, (
            f"{case.method} {case.path} {str(body)[:300]} -> {response.status_code}: {str(exc).strip()[:600]}"
        )
    return response.status_code, None
