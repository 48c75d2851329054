"""`tandem model layer-skip`: a draft made of a checkpoint's first layers keeps their tensors, the embedding, the
final norm and the head unchanged, speaks the target's tokenizer, and drafts for it with greedy output unchanged."""

import json

import pytest
from safetensors.torch import load_file

from engines.native.draft import check_draft
from tandem.models.errors import ModelError
from tandem.models.layer_skip import kept, layer_skip_checkpoint
from tests.conftest import TINY_VARIANTS
from tests.unit.engines.helpers import greedy, run_batch, started


def test_only_the_first_layers_and_what_is_outside_the_stack_are_kept():
    assert kept("model.layers.0.self_attn.q_proj.weight", 1) and kept("model.norm.weight", 1)
    assert kept("lm_head.weight", 1) and kept("model.embed_tokens.weight", 1)
    assert not kept("model.layers.1.mlp.up_proj.weight", 1) and not kept("model.layers.10.mlp.up_proj.weight", 2)


@pytest.mark.parametrize("variant", ["llama", "llama-tied"])
def test_the_draft_holds_the_targets_tensors_and_tokenizer(tiny_model_factory, tmp_path, variant):
    target = tiny_model_factory(variant)
    draft = layer_skip_checkpoint(target, tmp_path / "draft", 1)
    config = json.loads((draft / "config.json").read_text())
    assert config["num_hidden_layers"] == 1
    full = {k: v for f in sorted(target.glob("*.safetensors")) for k, v in load_file(f).items()}
    ours = load_file(draft / "model.safetensors")
    assert set(ours) == {k for k in full if kept(k, 1)} and len(ours) < len(full)
    assert all(ours[k].equal(full[k]) for k in ours)
    assert check_draft(str(target), str(draft)).vocab_size == config["vocab_size"]


def test_a_layer_count_the_model_cannot_give_is_refused(tiny_llama, tmp_path):
    layers = json.loads((tiny_llama / "config.json").read_text())["num_hidden_layers"]
    for bad in (0, layers):
        with pytest.raises(ModelError, match="--layers"):
            layer_skip_checkpoint(tiny_llama, tmp_path / "d", bad)
    with pytest.raises(ModelError, match="config.json"):
        layer_skip_checkpoint(tmp_path, tmp_path / "d", 1)


@pytest.mark.parametrize("variant", sorted(TINY_VARIANTS))
async def test_a_layer_skip_draft_drafts_with_greedy_output_unchanged(tiny_model_factory, tmp_path, variant):
    """Over every supported architecture: the draft proposer (its own paged cache, rolled back) never changes
    greedy output; the costs are timed at start here, and a fresh request probes whatever they say."""
    target = tiny_model_factory(variant)
    draft = layer_skip_checkpoint(target, tmp_path / "draft", 1)
    prompts = [[5, 9, 17, 33, 5, 9, 17], list(range(40, 70))]
    outputs, stats = {}, None
    for method in ("", f"draft:{draft}"):
        engine = await started(target, speculative=method)
        try:
            outputs[method] = await run_batch(engine, prompts, greedy(24))
            stats = engine.stats()
        finally:
            await engine.shutdown()
    assert outputs[f"draft:{draft}"] == outputs[""]
    assert stats.num_spec_proposed > 0


def test_per_layer_settings_shrink_with_the_stack(tiny_llama, tmp_path):
    import shutil

    src = tmp_path / "src"
    shutil.copytree(tiny_llama, src)
    config = json.loads((src / "config.json").read_text())
    layers = config["num_hidden_layers"]
    (src / "config.json").write_text(json.dumps({**config, "layer_types": ["full_attention"] * layers}))
    draft = layer_skip_checkpoint(src, tmp_path / "draft", 1)
    assert json.loads((draft / "config.json").read_text())["layer_types"] == ["full_attention"]
