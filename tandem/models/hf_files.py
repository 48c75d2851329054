"""Write Hugging Face checkpoint files: JSON configs, tokenizer files, and directories published atomically.

No model logic here: callers hand in finished dicts, tensors and `tokenizers.Tokenizer` objects.
"""

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tokenizers import Tokenizer

from tandem.models.errors import CheckpointWriteError

# NOTE: written last, inside the staging directory; a directory without it was never finished.
COMPLETE_MARKER = ".tandem-complete"

# ChatML, as Qwen and SmolLM2 use it, without a default system prompt.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def write_json(path: Path, data: dict) -> None:
    # sort_keys keeps files byte-identical across runs whatever order the dict was built in
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def read_marker(model_dir: Path) -> dict | None:
    """The completion marker's contents, or None when the directory is missing or unfinished."""
    marker = model_dir / COMPLETE_MARKER
    if not marker.is_file():
        return None
    try:
        return json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


@contextmanager
def staged_dir(final: Path, marker: dict, *, replace: bool = False) -> Iterator[Path]:
    """Yield a sibling temp dir to fill; on success write the marker and rename it to `final`.

    `replace` allows overwriting a previous tandem checkpoint; an empty directory is always replaced.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    _check_replaceable(final, replace)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.staging-", dir=final.parent))
    try:
        yield staging
        write_json(staging / COMPLETE_MARKER, marker)
        _make_readable(staging)
        _publish(staging, final, replace)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # a no-op once the rename succeeded


def _make_readable(staging: Path) -> None:
    # mkdtemp (and safetensors) create owner-only modes; a shared model cache must be readable by all
    staging.chmod(0o755)
    for path in staging.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


def _check_replaceable(final: Path, replace: bool) -> None:
    if not final.exists() or (final.is_dir() and not any(final.iterdir())):
        return
    if read_marker(final) is None:
        raise CheckpointWriteError(f"{str(final)!r} exists and is not a tandem checkpoint; refusing to overwrite")
    if not replace:
        raise CheckpointWriteError(f"{str(final)!r} already holds a checkpoint")


def _publish(staging: Path, final: Path, replace: bool) -> None:
    if final.is_dir() and not any(final.iterdir()):
        final.rmdir()
    try:
        os.rename(staging, final)
        return
    except OSError:
        if not final.exists():
            raise
    # `final` appeared or was there: only ever swap one finished tandem checkpoint for another
    if read_marker(final) is None:
        raise CheckpointWriteError(f"{str(final)!r} exists and is not a tandem checkpoint; refusing to overwrite")
    if not replace:
        return  # another process published the same checkpoint first; keep theirs
    old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
    os.rename(final, old / "ckpt")  # moved aside first, so `final` is never half-written
    os.rename(staging, final)
    shutil.rmtree(old, ignore_errors=True)


def write_tokenizer_files(
    out_dir: Path,
    tokenizer: Tokenizer,
    *,
    chat_template: str | None,
    special: dict[str, str | None],
    model_max_length: int,
) -> None:
    """tokenizer.json plus the tokenizer_config.json and special_tokens_map.json transformers reads.

    `special` maps bos_token/eos_token/pad_token/unk_token to token strings (or None).
    """
    tokenizer.save(str(out_dir / "tokenizer.json"))
    config = {
        # NOTE: the generic class loads tokenizer.json as is; a model-specific class (GPT2Tokenizer)
        # would rebuild the pre-tokenizer in transformers 5 and lose e.g. SmolLM2's digit splitting.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": _added_tokens_decoder(tokenizer),
        **special,
    }
    if chat_template is not None:
        config["chat_template"] = chat_template
    write_json(out_dir / "tokenizer_config.json", config)
    write_json(out_dir / "special_tokens_map.json", {k: v for k, v in special.items() if v is not None})


def _added_tokens_decoder(tokenizer: Tokenizer) -> dict[str, dict]:
    decoder = tokenizer.get_added_tokens_decoder()
    return {
        str(token_id): {
            "content": tok.content,
            "lstrip": tok.lstrip,
            "normalized": tok.normalized,
            "rstrip": tok.rstrip,
            "single_word": tok.single_word,
            "special": tok.special,
        }
        for token_id, tok in sorted(decoder.items())
    }
