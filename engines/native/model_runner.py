"""ModelRunner: turns a scheduled step into tensors, runs the model, samples. Owns the model,
the KV cache and the attention backend; knows nothing of requests' lifecycles."""

import torch

from engines.base.block_hash import num_blocks_for
from engines.base.types import KvLayout
from engines.core.step import ScheduledSeq, SchedulerOutput
from engines.native.attention import AttentionMetadata, FreshSpans, PrefillSpan, get_backend, resolve_backend
from engines.native.attention.varlen import build_varlen_metadata
from engines.native.config import EngineConfig, ModelConfig
from engines.native.grammar import Grammars
from engines.native.kv_cache import FP8_KV_DTYPE, KvCache, available_memory, bytes_per_block, gpu_share_left
from engines.native.layers.linear import Linear
from engines.native.layers.rotary import RotaryEmbedding
from engines.native.loader import load_model
from engines.native.quant.swap import read_quant_config
from engines.native.sampler import SampledTokens, SampleRow, sample

MAX_DEFAULT_MODEL_LEN = 8192


class ModelRunner:
    def __init__(self, config: EngineConfig, model_cfg: ModelConfig):
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.config, self.model_cfg = config, model_cfg
        self.device, self.dtype = config.device, getattr(torch, config.dtype)
        self.block_size = config.cache.block_size
        self.max_model_len = resolve_max_model_len(config, model_cfg)
        self.backend_name = resolve_backend(self.device, config.attention_backend)
        self.model = load_model(
            config.model, model_cfg, get_backend(self.device, self.backend_name), self.dtype, self.device
        )
        if self.device == "cpu" and config.dtype == "float32" and torch.backends.mkldnn.is_available():
            for module in self.model.modules():
                if isinstance(module, Linear):
                    module.pack_for_cpu()
        kv_dtype = FP8_KV_DTYPE if config.kv_cache_dtype == "fp8" else config.dtype
        self.kv_layout = KvLayout(
            model_cfg.num_hidden_layers,
            model_cfg.num_key_value_heads,
            model_cfg.head_dim,
            kv_dtype,
            config.cache.block_size,
        )
        quant = read_quant_config(config.model)
        self.kv_cache = KvCache(
            self.kv_layout,
            self._num_blocks(),
            self.device,
            quant.kv_cache_scales if quant and config.kv_cache_dtype == "fp8" else (),
        )
        rotary = RotaryEmbedding(
            model_cfg.head_dim, self.max_model_len, model_cfg.rope_theta, model_cfg.rope_scaling, self.device
        )
        for i, attn in enumerate(self.model.attention_layers):
            attn.k_cache, attn.v_cache = self.kv_cache.layer(i)
            attn.rotary = rotary
            if self.kv_cache.is_quantized:  # NOTE: one backend per layer, holding that layer's scales
                scales = tuple(self.kv_cache.scales[i].tolist())
                attn.backend = get_backend(self.device, self.backend_name, scales)
        self.graphs = self._maybe_capture_graphs()
        self.generator = torch.Generator(device=self.device)  # unseeded sampling rows draw from it
        self.generator.seed()
        # NOTE: a step's masks are computed on the grammar thread while its forward pass runs
        self.grammars = Grammars.maybe_load(
            config.model, model_cfg.vocab_size, model_cfg.eos_token_ids, str(self.device)
        )

    @property
    def num_blocks(self) -> int:
        return self.kv_cache.num_blocks

    def _maybe_capture_graphs(self):
        if not (self.config.cuda_graphs and self.device.startswith("cuda") and self.backend_name == "triton"):
            return None
        from engines.native.cuda_graphs import DecodeGraphs

        graphs = DecodeGraphs(
            self.model, self.config.batch.max_num_seqs, num_blocks_for(self.max_model_len, self.block_size), self.device
        )
        graphs.capture()
        return graphs

    def _num_blocks(self) -> int:
        cache = self.config.cache
        if cache.num_blocks:
            return cache.num_blocks
        if cache.gpu_memory_utilization and str(self.device).startswith("cuda"):
            # NOTE: a margin for activations and graphs, which come after the cache is sized
            budget = int(gpu_share_left(str(self.device), cache.gpu_memory_utilization) * 0.9)
        else:
            budget = int(available_memory(self.device) * cache.kv_cache_memory_fraction)
        by_memory = budget // bytes_per_block(self.kv_layout)
        # enough for every running sequence at full length, twice over for the prefix cache
        useful = 2 * self.config.batch.max_num_seqs * num_blocks_for(self.max_model_len, self.block_size)
        return max(1, min(by_memory, useful))

    @torch.inference_mode()
    def launch(self, out: SchedulerOutput) -> SampledTokens | None:
        """Enqueue one step (on a GPU the host does not wait); the sampled tokens of `out.sampling`, in order."""
        order = sorted(out.scheduled, key=lambda s: not _is_decode(s))  # decodes first
        masks = self.grammars.start([s.seq for s in out.sampling]) if self.grammars is not None else None
        if self.graphs is not None and len(order) <= self.graphs.max_num_seqs and all(map(_is_decode, order)):
            hidden = self._graph_decode(order)  # [num_decodes, hidden_size]
            last_rows = {id(s): i for i, s in enumerate(order)}
        else:
            input_ids, positions, meta, last_rows = self._prepare(order)
            hidden = self.model(input_ids, positions, meta)  # [num_tokens, hidden_size]
        samplers = out.sampling
        if not samplers:
            return None
        sizes = [1 + len(s.spec_token_ids) for s in samplers]
        # NOTE: a verifying sequence's rows are its last 1 + k positions: each scores the next proposal
        rows = torch.tensor(
            [r for s, n in zip(samplers, sizes) for r in range(last_rows[id(s)] - n + 1, last_rows[id(s)] + 1)],
            device=self.device,
        )
        logits = self.model.compute_logits(hidden[rows]).float()  # [num_rows, vocab_size]
        allowed = masks.wait() if masks is not None else None
        is_verifying = len(sizes) != len(rows)
        if allowed is not None and is_verifying:  # one mask per sampler, repeated over its rows
            allowed = allowed.repeat_interleave(torch.tensor(sizes, device=allowed.device), dim=0)
        return sample(
            logits,
            [r for s in samplers for r in _sample_rows(s)],
            self.generator,
            allowed,
            tuple(sizes) if is_verifying else (),
        )

    @torch.inference_mode()
    def prompt_logits(self, scheduled: ScheduledSeq) -> torch.Tensor:
        """Logits at every position of one prefill span: [num_new_tokens, vocab_size] float32."""
        input_ids, positions, meta, _ = self._prepare([scheduled])
        return self.model.compute_logits(self.model(input_ids, positions, meta)).float()

    def _prepare(self, order: list[ScheduledSeq]):
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        decodes: list[ScheduledSeq] = []
        spans: list[tuple[ScheduledSeq, int]] = []
        last_rows: dict[int, int] = {}
        for s in order:
            start, end = s.start, s.start + s.num_new_tokens
            if _is_decode(s):
                decodes.append(s)
            else:
                spans.append((s, len(ids)))
            ids.extend(s.input_ids() if s.spec_token_ids else s.seq.token_ids[start:end])
            pos.extend(range(start, end))
            slots.extend(self._slot(s.seq.block_table, p) for p in range(start, end))
            last_rows[id(s)] = len(ids) - 1
        if self.backend_name == "triton":
            meta = build_varlen_metadata(
                self._tensor(slots),
                [(s.seq.block_table, s.start + 1) for s in decodes],
                [self._span_varlen(s, q_start) for s, q_start in spans],
                self.device,
            )
            return self._tensor(ids), self._tensor(pos), meta, last_rows
        meta = AttentionMetadata(
            slot_mapping=self._tensor(slots),
            num_decode_tokens=len(decodes),
            **self._decode_meta(decodes),
            prefills=[self._span(s, q_start) for s, q_start in spans if s.start > 0],
            fresh=self._fresh([(s.num_new_tokens, q_start) for s, q_start in spans if s.start == 0]),
        )
        return self._tensor(ids), self._tensor(pos), meta, last_rows

    def _graph_decode(self, order: list[ScheduledSeq]) -> torch.Tensor:
        return self.graphs.run(
            [s.seq.token_ids[s.start] for s in order],
            [s.start for s in order],
            [self._slot(s.seq.block_table, s.start) for s in order],
            [s.seq.block_table for s in order],
            [s.start + 1 for s in order],
        )

    def _span_varlen(self, s: ScheduledSeq, q_start: int) -> tuple[int, int, int, list[int]]:
        ctx_len = s.start + s.num_new_tokens
        return q_start, s.num_new_tokens, ctx_len, s.seq.block_table[: num_blocks_for(ctx_len, self.block_size)]

    def _slot(self, block_table: list[int], position: int) -> int:
        return block_table[position // self.block_size] * self.block_size + position % self.block_size

    def _tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    def _decode_meta(self, decodes: list[ScheduledSeq]) -> dict:
        if not decodes:
            return {}
        max_blocks = max(len(s.seq.block_table) for s in decodes)
        tables = [s.seq.block_table + [0] * (max_blocks - len(s.seq.block_table)) for s in decodes]
        ctx_lens = self._tensor([s.start + 1 for s in decodes])
        mask = torch.arange(max_blocks * self.block_size, device=self.device)[None, :] < ctx_lens[:, None]
        return {
            "decode_block_tables": self._tensor([b for t in tables for b in t]),
            "decode_mask": mask[:, None, None, :],
        }

    def _fresh(self, spans: list[tuple[int, int]]) -> FreshSpans | None:
        """Index maps that pad fresh spans (q_len, q_start) into one [num_spans, max_len] batch."""
        if not spans:
            return None
        max_len = max(n for n, _ in spans)
        gather, src, dst = [], [], []
        for i, (n, start) in enumerate(spans):
            gather.extend(range(start, start + n))
            gather.extend([start] * (max_len - n))  # pads: any real row, never attended to
            src.extend(range(i * max_len, i * max_len + n))
            dst.extend(range(start, start + n))
        padded = len(gather) != len(src)
        return FreshSpans(
            self._tensor(gather), len(spans), max_len, self._tensor(src) if padded else None, self._tensor(dst)
        )

    def _span(self, s: ScheduledSeq, q_start: int) -> PrefillSpan:
        q_len, ctx_len = s.num_new_tokens, s.start + s.num_new_tokens
        table = self._tensor(s.seq.block_table[: num_blocks_for(ctx_len, self.block_size)])
        q_pos = torch.arange(s.start, ctx_len, device=self.device)
        mask = torch.arange(ctx_len, device=self.device)[None, :] <= q_pos[:, None]  # [q_len, ctx_len]
        return PrefillSpan(q_start, q_len, ctx_len, table, mask)


def _sample_rows(s: ScheduledSeq) -> list[SampleRow]:
    """One row per token the step may generate for `s`: the next token, and after each proposal the one after it
    (index, banned stop tokens and penalty history as if the proposals before it were accepted)."""
    seq, spec = s.seq, s.spec_token_ids
    if not spec:
        return [
            SampleRow(seq.params, seq.num_output_tokens, seq.banned_token_ids(), seq.token_ids, seq.num_prompt_tokens)
        ]
    rows = []
    for j in range(len(spec) + 1):
        index = seq.num_output_tokens + j
        banned = seq.stop_token_ids if index < seq.params.min_tokens else ()
        history = seq.token_ids + list(spec[:j]) if seq.params.has_penalties else seq.token_ids
        rows.append(
            SampleRow(seq.params, index, banned, history, seq.num_prompt_tokens, spec[j] if j < len(spec) else -1)
        )
    return rows


def _is_decode(s: ScheduledSeq) -> bool:
    return s.num_new_tokens == 1 and s.start > 0


def resolve_max_model_len(config: EngineConfig, model_cfg: ModelConfig) -> int:
    limit = model_cfg.max_position_embeddings
    if model_cfg.sliding_window:  # NOTE: no sliding-window attention here: stay inside the window
        limit = min(limit, model_cfg.sliding_window)
    asked = config.batch.max_model_len
    if not asked:
        return min(limit, MAX_DEFAULT_MODEL_LEN)
    if asked > limit:
        raise ValueError(f"max_model_len {asked} exceeds the model's limit {limit}")
    return asked
