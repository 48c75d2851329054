"""The served model as the gateway sees it: tokenizer, chat template, context length.

Loaded once at start-up from the checkpoint directory; it never loads weights.
"""
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from jinja2 import TemplateError
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from services.common.settings import SettingsError
from services.gateway.errors import ContextLengthError, InvalidRequestError

log = logging.getLogger(__name__)
MAX_DEFAULT_MODEL_LEN = 8192  # NOTE: the native engine's cap; the two must agree


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str
    tokenizer: PreTrainedTokenizerBase
    max_model_len: int
    vocab_size: int  # the embedding's rows: token ids a prompt may hold
    created: int  # unix time the gateway loaded it, for /v1/models

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        """The chat template with the assistant's turn opened, as token ids."""
        if not self.tokenizer.chat_template:
            raise InvalidRequestError("this model has no chat template; use /v1/completions", param="messages")
        try:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except TemplateError as exc:
            raise InvalidRequestError(f"messages do not fit the chat template: {exc}", param="messages") from None
        # NOTE: the template already wrote any BOS it wants; adding special tokens again would double it
        return self.tokenizer.encode(text, add_special_tokens=False)

    def text_prompt(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=True)

    def check_prompt(self, token_ids: list[int], param: str) -> None:
        """Raise unless the prompt leaves room for at least one generated token."""
        if not token_ids:
            raise InvalidRequestError("the prompt is empty", param=param)
        if len(token_ids) + 1 > self.max_model_len:
            raise ContextLengthError(
                f"This model's maximum context length is {self.max_model_len} tokens; the prompt has "
                f"{len(token_ids)} tokens, which leaves no room to generate.", param=param)
        if max(token_ids) >= self.vocab_size or min(token_ids) < 0:
            raise InvalidRequestError(f"token ids must be in [0, {self.vocab_size})", param=param)

    def max_new_tokens(self, num_prompt_tokens: int, requested: int | None) -> int:
        """What the worker may generate: the request's limit, capped by what the context still holds."""
        room = self.max_model_len - num_prompt_tokens
        return room if requested is None else min(requested, room)


def load_model_info(model_dir: str, name: str, max_model_len: int | None, created: int) -> ModelInfo:
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise SettingsError(f"{model_dir!r} is not a model directory (no config.json)")
    config = json.loads((path / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    limit = resolve_max_model_len(config, max_model_len)
    vocab_size = max(config.get("vocab_size", 0), len(tokenizer))
    log.info("model %s: context %d tokens, vocab %d", name, limit, vocab_size)
    return ModelInfo(name, tokenizer, limit, vocab_size, created)


def resolve_max_model_len(config: dict, override: int | None) -> int:
    limit = config.get("max_position_embeddings", 2048)
    # NOTE: the same rule as the engine: Qwen configs carry a window they only use when asked to
    uses_window = config.get("use_sliding_window", config.get("model_type") not in ("qwen2", "qwen3"))
    if uses_window and config.get("sliding_window"):
        limit = min(limit, int(config["sliding_window"]))
    if override is None:
        return min(limit, MAX_DEFAULT_MODEL_LEN)
    if override > limit:
        raise SettingsError(f"max_model_len {override} exceeds the model's limit {limit}")
    return override
