"""The served model as the gateway sees it: tokenizer, chat template, vocabulary. The context length is the
engines' (their workers report it to the router, the gateway reads it there).

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


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str
    tokenizer: PreTrainedTokenizerBase
    vocab_size: int  # the embedding's rows: token ids a prompt may hold
    created: int  # unix time the gateway loaded it, for /v1/models

    def chat_prompt(self, messages: list[dict], tools: list[dict] | None = None, max_chars: int = 0) -> list[int]:
        """The chat template with the assistant's turn opened, as token ids; `tools` for templates that render
        them (tool_calls.template_renders_tools). `max_chars` caps the messages and the template's output, before
        either is rendered or tokenized (0: no cap)."""
        if not self.tokenizer.chat_template:
            raise InvalidRequestError("this model has no chat template; use /v1/completions", param="messages")
        check_chars(sum(len(str(v)) for m in messages for v in m.values()), max_chars, "messages", "the messages")
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, **({"tools": tools} if tools else {})
            )
        except TemplateError as exc:
            raise InvalidRequestError(f"messages do not fit the chat template: {exc}", param="messages") from None
        check_chars(len(text), max_chars, "messages", "the chat template's output")
        # NOTE: the template already wrote any BOS it wants; adding special tokens again would double it
        return self.tokenizer.encode(text, add_special_tokens=False)

    def text_prompt(self, text: str, max_chars: int = 0) -> list[int]:
        check_chars(len(text), max_chars, "prompt", "the prompt")
        return self.tokenizer.encode(text, add_special_tokens=True)

    def check_prompt(self, token_ids: list[int], param: str, max_model_len: int) -> None:
        """Raise unless the prompt leaves room for at least one generated token in the engines' context."""
        if not token_ids:
            raise InvalidRequestError("the prompt is empty", param=param)
        if len(token_ids) + 1 > max_model_len:
            raise ContextLengthError(
                f"This model's maximum context length is {max_model_len} tokens; the prompt has "
                f"{len(token_ids)} tokens, which leaves no room to generate.",
                param=param,
            )
        if max(token_ids) >= self.vocab_size or min(token_ids) < 0:
            raise InvalidRequestError(f"token ids must be in [0, {self.vocab_size})", param=param)

    def check_logit_bias(self, pairs: tuple[tuple[int, float], ...]) -> None:
        if pairs and pairs[-1][0] >= self.vocab_size:
            raise InvalidRequestError(
                f"logit_bias token ids must be in [0, {self.vocab_size}), got {pairs[-1][0]}", param="logit_bias"
            )

    def max_new_tokens(
        self, num_prompt_tokens: int, requested: int | None, max_model_len: int, param: str = "max_tokens"
    ) -> int:
        """The request's limit as asked (a 400 naming `param` past what the context leaves); with none, what the
        context leaves."""
        left = max_model_len - num_prompt_tokens
        if requested is not None and requested > left:
            raise InvalidRequestError(  # NOTE: 400 as OpenAI and vLLM answer it (a too-long prompt stays 413)
                f"This model's maximum context length is {max_model_len} tokens; the prompt has {num_prompt_tokens} "
                f"tokens, so {param} may be at most {left}, got {requested}.",
                param=param,
            )
        return left if requested is None else requested


def check_chars(num_chars: int, max_chars: int, param: str, what: str) -> None:
    """A 400 for text too long to template or tokenize: both cost time in proportion to it."""
    if max_chars and num_chars > max_chars:
        raise InvalidRequestError(
            f"{what} hold {num_chars} characters; this server takes at most {max_chars} before tokenizing", param=param
        )


def load_model_info(model_dir: str, name: str, created: int) -> ModelInfo:
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise SettingsError(f"{model_dir!r} is not a model directory (no config.json)")
    config = json.loads((path / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    vocab_size = max(config.get("vocab_size", 0), len(tokenizer))
    log.info("model %s: vocab %d", name, vocab_size)
    return ModelInfo(name, tokenizer, vocab_size, created)
