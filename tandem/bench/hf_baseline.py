"""The Hugging Face transformers baseline: one batched greedy `model.generate` over all prompts,
timed per step by a stopping criterion. Takes token ids; never tokenizes, never touches the native engine."""

import time

import torch
from transformers import AutoModelForCausalLM, StoppingCriteria, StoppingCriteriaList

from tandem.bench.stats import RequestTrace

_PAD_ID = 0  # masked out; any valid id works


class _StepClock(StoppingCriteria):
    """Called by generate right after each step appends a token to every row: stamps the time, never stops."""

    def __init__(self) -> None:
        self.times_s: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        self.times_s.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


class HfRunner:
    def __init__(self, model_dir, dtype: str):
        self.dtype = dtype
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, dtype)).eval()
        # NOTE: no EOS at all, like the native engine's ignore_eos: every row runs the full length.
        self.model.generation_config.eos_token_id = None
        self.model.generation_config.pad_token_id = _PAD_ID

    @property
    def mode(self) -> str:
        attn = getattr(self.model.config, "_attn_implementation", "default")
        return (
            f"model.generate: all requests in one static batch, left padding, greedy, "
            f"DynamicCache, attn_implementation={attn}"
        )

    def warm_up(self, prompts: list[list[int]]) -> None:
        self.run(prompts, osl=2)

    def run(self, prompts: list[list[int]], osl: int) -> list[RequestTrace]:
        """Generate exactly `osl` tokens per prompt; each request's token i arrives at step i's time."""
        input_ids, attention_mask = left_pad(prompts)
        clock = _StepClock()
        submit_s = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                do_sample=False,
                max_new_tokens=osl,
                min_new_tokens=osl,
                stopping_criteria=StoppingCriteriaList([clock]),
            )
        num_new = out.shape[1] - input_ids.shape[1]
        if num_new != osl or len(clock.times_s) != osl:
            raise RuntimeError(f"transformers made {num_new} tokens in {len(clock.times_s)} steps, wanted {osl}")
        return [RequestTrace(submit_s, list(clock.times_s)) for _ in prompts]


def left_pad(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """[batch, max_len] ids and mask, padded on the left so every row's last token lines up."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), _PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return ids, mask


def count_parameters(model_dir) -> int:
    """The parameters a token's forward pass multiplies by, counted on the meta device: no weights load."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(model_dir))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return matmul_parameters(model)


def matmul_parameters(model) -> int:
    """Unique parameters, with an untied embedding table left out: it is a lookup, not a matmul."""
    total = model.num_parameters()
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    is_tied = head is not None and head.weight is embed.weight
    return total if is_tied else total - embed.weight.numel()
