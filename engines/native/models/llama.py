"""The Llama family as one readable model: GQA/MQA/MHA, optional qkv bias (Qwen2), q/k norm
(Qwen3), tied or untied embeddings, llama3 rope scaling. Attention goes through a paged backend;
the small ops (residual + RMSNorm, SiLU-mul) through the implementation that backend names.
"""

import torch
from torch import nn

from engines.native.attention import AttentionMetadata
from engines.native.config import ModelConfig
from engines.native.layers.linear import Linear, MergedLinear
from engines.native.layers.norm import RMSNorm
from engines.native.layers.rotary import RotaryEmbedding


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, backend):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = MergedLinear(
            cfg.hidden_size, {"q": q_size, "k": kv_size, "v": kv_size}, bias=cfg.attention_bias
        )
        self.o_proj = Linear(q_size, cfg.hidden_size, bias=cfg.o_proj_bias)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.split = (q_size, kv_size, kv_size)
        self.scale = self.head_dim**-0.5
        self.backend = backend
        self.rotary: RotaryEmbedding | None = None  # set by the runner with the cache
        self.k_cache = self.v_cache = torch.empty(0)  # views into the engine's one KV allocation

    def forward(self, x, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split(self.split, dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)  # [num_tokens, num_heads, head_dim]
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        out = self.backend.forward(q, k, v, self.k_cache, self.v_cache, meta, self.scale, positions, self.rotary)
        return self.o_proj(out.reshape(-1, self.num_heads * self.head_dim))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig, ops):
        super().__init__()
        size = cfg.intermediate_size
        self.gate_up_proj = MergedLinear(cfg.hidden_size, {"gate": size, "up": size})
        self.down_proj = Linear(size, cfg.hidden_size)
        self.ops = ops

    def forward(self, x) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)  # [num_tokens, 2 * intermediate_size]
        return self.down_proj(self.ops.silu_mul(gate_up, self.down_proj.input_quant(gate_up.shape[0])))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, backend):
        super().__init__()
        self.self_attn = LlamaAttention(cfg, backend)
        self.mlp = LlamaMLP(cfg, backend.ops)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.ops = backend.ops

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor, meta: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (this layer's MLP output, the residual stream before it): the next norm adds them,
        so x + attn(norm(x)) + mlp(...) is computed with each sum rounded as the eager code rounds it."""
        num_tokens = x.shape[0]
        h, residual = self.ops.add_rms_norm(
            x, residual, self.input_layernorm, self.self_attn.qkv_proj.input_quant(num_tokens)
        )
        h = self.self_attn(h, positions, meta)
        h, residual = self.ops.add_rms_norm(
            h, residual, self.post_attention_layernorm, self.mlp.gate_up_proj.input_quant(num_tokens)
        )
        return self.mlp(h), residual


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, backend):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, backend) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.ops = backend.ops

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata):
        x = self.embed_tokens(input_ids)  # [num_tokens, hidden_size]
        residual = None
        for layer in self.layers:
            x, residual = layer(x, residual, positions, meta)
        return self.ops.add_rms_norm(x, residual, self.norm)[0]


class LlamaForCausalLM(nn.Module):
    # checkpoint name fragment -> (our merged parameter fragment, shard)
    packed_modules = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", "gate"),
        "up_proj": ("gate_up_proj", "up"),
    }

    def __init__(self, cfg: ModelConfig, backend):
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg, backend)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata):
        return self.model(input_ids, positions, meta)  # [num_tokens, hidden_size]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)  # [num_rows, vocab_size]

    @property
    def attention_layers(self) -> list[LlamaAttention]:
        return [layer.self_attn for layer in self.model.layers]
