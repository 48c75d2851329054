"""`tandem model ...`: the checkpoint directory is the last line of stdout; errors exit 2 with a message."""

import json

import pytest

from tandem.cli import main
from tandem.models.cli import parse_override
from tandem.models.errors import ModelError


def last_stdout_line(capsys) -> str:
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_model_init_prints_dir_and_applies_overrides(tmp_path, capsys):
    out = tmp_path / "m"
    argv = [
        "model",
        "init",
        str(out),
        "--arch",
        "qwen2",
        "--seed",
        "3",
        "--set",
        "tie_word_embeddings=true",
        "--set",
        "num_key_value_heads=1",
    ]
    assert main(argv) == 0
    assert last_stdout_line(capsys) == str(out)
    config = json.loads((out / "config.json").read_text())
    assert (config["tie_word_embeddings"], config["num_key_value_heads"]) == (True, 1)


def test_model_fetch_prints_dir(tmp_path, capsys):
    assert main(["model", "fetch", str(tmp_path)]) == 0
    assert last_stdout_line(capsys) == str(tmp_path)


def test_model_fetch_links_a_fixed_path_to_the_dir_and_moves_it_on_the_next_fetch(tmp_path, capsys):
    first, second, link = tmp_path / "first", tmp_path / "second", tmp_path / "cache" / "model"
    first.mkdir(), second.mkdir(), link.parent.mkdir()
    assert main(["model", "fetch", str(first), "--link", str(link)]) == 0
    assert last_stdout_line(capsys) == str(first) and link.resolve() == first.resolve()
    assert main(["model", "fetch", str(second), "--link", str(link)]) == 0
    assert link.is_symlink() and link.resolve() == second.resolve()
    assert sorted(p.name for p in link.parent.iterdir()) == ["model"]  # no staged link left behind


def test_model_fetch_never_replaces_a_directory_with_a_link(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    assert main(["model", "fetch", str(tmp_path), "--link", str(tmp_path / "model")]) == 2
    assert "something other than a symlink is there" in capsys.readouterr().err
    assert (tmp_path / "model").is_dir() and not (tmp_path / "model").is_symlink()


def test_model_errors_exit_2(tmp_path, capsys):
    assert main(["model", "fetch", "acme/unknown", "--cache-dir", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "tandem: error: cannot fetch 'acme/unknown'" in captured.err


def test_parse_override():
    assert parse_override('rope_scaling={"rope_type": "llama3"}') == ("rope_scaling", {"rope_type": "llama3"})
    assert parse_override("hidden_act=gelu") == ("hidden_act", "gelu")
    assert parse_override("rms_norm_eps=1e-5") == ("rms_norm_eps", 1e-5)
    with pytest.raises(ModelError, match="KEY=VALUE"):
        parse_override("oops")


def test_up_serves_the_fetched_model_under_its_short_name():
    from tandem.launcher import served_name

    assert served_name("/c/models/HuggingFaceTB--SmolLM2-135M-Instruct") == "SmolLM2-135M-Instruct"
    assert served_name("/tmp/tiny-llama") == "tiny-llama"


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_model_quantize_writes_a_copy_the_loader_swaps_in(tmp_path, capsys, fmt):
    import torch

    from engines.native.attention import get_backend
    from engines.native.config import ModelConfig
    from engines.native.loader import load_model

    src, dst = tmp_path / "src", tmp_path / fmt
    assert main(["model", "init", str(src), "--arch", "llama"]) == 0
    assert main(["model", "quantize", str(src), str(dst), "--format", fmt]) == 0
    assert last_stdout_line(capsys) == str(dst)
    assert json.loads((dst / "tandem_quant.json").read_text())["format"] == fmt
    model = load_model(dst, ModelConfig.from_dir(dst), get_backend("cpu"), torch.float32, "cpu")
    quantized = [
        name for name, module in model.named_modules() if type(module).__module__.startswith("engines.native.quant")
    ]
    assert quantized, "no linear layer was swapped for its quantized module"


def test_model_quantize_refuses_a_directory_without_a_checkpoint(tmp_path, capsys):
    assert main(["model", "quantize", str(tmp_path), str(tmp_path / "out"), "--format", "fp8"]) == 2
    assert "not a checkpoint directory" in capsys.readouterr().err
