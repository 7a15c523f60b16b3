"""The Llama decode step in plain PyTorch, with the position read from the device.

It runs the model's own modules, so it matches the eager forward op for op, except that
the rotary row and the cache slot come from `cache_seqlens` instead of the host mirror.
That makes it capturable in a CUDA graph (the plain-graph baseline in the benchmark) and
a reference the fused Triton step is checked against, on any device.
"""

from __future__ import annotations

import torch

from kvcache import KVCache
from model.families.layers import StepAttention
from model.families.llama import Llama


class LlamaTorchStep:
    """`step()` feeds `tok` at position cache_seqlens and writes `logits`. It does not advance
    the cache: the caller does (`cache.advance(1)`) once the token is really fed."""

    name = "torch"

    def __init__(self, model: Llama, cache: KVCache, num_splits: int = 1):
        self.model, self.cache = model, cache
        dev = cache.device
        self.tok = torch.zeros(1, dtype=torch.long, device=dev)
        self.logits = torch.zeros(model.config.vocab_size, dtype=torch.float32, device=dev)
        self.attend = StepAttention(model.attn, cache, num_splits)
        self.attn_name = self.attend.name

    def __call__(self) -> torch.Tensor:
        m, c = self.model, self.cache
        pos = c.cache_seqlens
        posl = pos.long()
        self.attend.start(pos)
        cos_t, sin_t = m.rope(pos.device)
        cos, sin = cos_t.index_select(0, posl), sin_t.index_select(0, posl)
        x = m.model.embed_tokens(self.tok.view(1, 1))
        for i, layer in enumerate(m.model.layers):
            a = layer.self_attn
            h = layer.input_layernorm(x)
            q, k, v = a.qkv(h, cos, sin)  # the eager projections: biases and qk-norm included
            kc, vc = c.get_layer_cache(i)
            kc.index_copy_(1, posl, k)
            vc.index_copy_(1, posl, v)
            x = x + a.o_proj(self.attend(q, kc, vc, pos).reshape(1, 1, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        self.logits.copy_(m.lm_head(m.model.norm(x))[0, 0])
        return self.logits
