"""docs/configuration.md is generated from the settings classes (`tandem config docs`): this fails when the committed
file is stale, and checks that every service's variables are in it."""

import json
from pathlib import Path

from services.router.settings import RouterSettings
from tandem.config_docs import DOC, field_comments, render

NAMES = Path(__file__).parents[1] / "services" / "common" / "settings_names.json"


def test_the_committed_file_is_what_the_settings_generate():
    assert DOC.read_text() == render(), "docs/configuration.md is stale: run `tandem config docs`"


def test_every_variable_a_service_reads_is_documented():
    text = DOC.read_text()
    names = {n for service in json.loads(NAMES.read_text()).values() for n in service["env"]}
    assert sorted(n for n in names if f"`{n}`" not in text and not _in_a_group(n, text)) == []


def _in_a_group(name: str, text: str) -> bool:
    """`TANDEM_GRPC_TLS_CERT`, `_KEY`, ... documents `TANDEM_GRPC_TLS_KEY` too."""
    stem, _, last = name.rpartition("_")
    return f"`_{last}`" in text and f"`{stem}_" in text


def test_a_fields_comment_is_its_meaning():
    comments = field_comments(RouterSettings)
    assert comments["lease_ttl_s"] == "a worker silent this long leaves the pool"
    # a comment on the lines above a field is its meaning too
    assert comments["load_stream_interval_s"].startswith("prefill workers' load streamed as it changes")
