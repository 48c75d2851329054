"""The gateway's OpenAPI document: served at /openapi.json, it names every route the app has, and the gateway
holds to it under fuzzing (schemathesis: valid and invalid requests, against fake router and workers) — never a
5xx, only documented statuses and bodies."""

import asyncio

from services.gateway.openapi import build_schema
from tandem.chaos.fuzz import fuzz

FUZZ_CASES = 120  # a short budget for make test; `tandem chaos` runs 1,000 against a live stack


async def test_schema_is_served_and_names_every_route(stack):
    served = (await stack.http.get("/openapi.json")).json()
    assert served == build_schema("tandem gateway", served["info"]["version"])
    assert served["openapi"] == "3.1.0"
    routes = {r.path_format for r in (await _app_routes(stack)) if not r.path.startswith("/openapi")}
    assert set(served["paths"]) == routes
    errors = served["paths"]["/v1/completions"]["post"]["responses"]
    assert errors["429"]["headers"]["Retry-After"]["required"] and errors["503"]["headers"]["Retry-After"]["required"]
    assert "500" not in errors


async def _app_routes(stack):
    from services.gateway.server import create_app
    from services.gateway.settings import GatewaySettings

    app = create_app(GatewaySettings(model_dir=stack.model_dir, router_address="127.0.0.1:1"))
    return [r for r in app.routes if hasattr(r, "methods")]


async def test_fuzzing_finds_no_server_error_and_no_undocumented_answer(stack):
    result = await asyncio.to_thread(fuzz, stack.base_url, FUZZ_CASES, 7)
    assert result.failures == [] and result.num_failures == 0
    assert result.cases >= FUZZ_CASES
    assert not [s for s in result.statuses if s == "none" or s.startswith("5")]
    assert result.statuses["200"] > 0 and result.statuses["400"] > 0  # some reached the workers, some were refused
