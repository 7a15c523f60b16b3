"""The Llama decode step in plain PyTorch, with the position read from the device.

It runs the model's own modules, so it matches the eager forward op for op, except that
the rotary row and the cache slot come from `cache_seqlens` instead of the host mirror.
That makes it capturable in a CUDA graph (the plain-graph baseline in the benchmark) and
a reference the fused Triton step is checked against, on any device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvcache import KVCache
from model.llama import Llama, apply_rotary


class LlamaTorchStep:
    """`step()` feeds `tok` at position cache_seqlens and writes `logits`. It does not advance
    the cache: the caller does (`cache.advance(1)`) once the token is really fed."""

    name = "torch"

    def __init__(self, model: Llama, cache: KVCache, num_splits: int = 1):
        self.model, self.cache = model, cache
        dev = cache.device
        self.tok = torch.zeros(1, dtype=torch.long, device=dev)
        self.logits = torch.zeros(model.config.vocab_size, dtype=torch.float32, device=dev)
        self.seqlens_k = torch.zeros(1, dtype=torch.int32, device=dev)
        flash = model.attn.flash
        probe = torch.empty(1, 1, 1, 1, device=dev, dtype=cache.dtype)
        self.flash = flash if flash is not None and flash.can_serve(probe, (-1, -1), 0.0) else None
        self.num_splits = num_splits
        self.key_pos = torch.arange(cache.capacity, device=dev)
        self.attn_name = self.flash.name if self.flash else "sdpa"

    def _attend(self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        if self.flash is not None:
            return self.flash.fn(q, kc, vc, cache_seqlens=self.seqlens_k, causal=True,
                                 num_splits=self.num_splits)
        # Masked over the whole capacity: shapes stay fixed, so a graph can hold it.
        mask = (self.key_pos <= pos)[None, None, None, :]
        out = F.scaled_dot_product_attention(q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2),
                                             attn_mask=mask, enable_gqa=True)
        return out.transpose(1, 2)

    def __call__(self) -> torch.Tensor:
        m, c = self.model, self.cache
        pos = c.cache_seqlens
        posl = pos.long()
        torch.add(pos, 1, out=self.seqlens_k)
        cos_t, sin_t = m.rope(pos.device)
        cos, sin = cos_t.index_select(0, posl), sin_t.index_select(0, posl)
        x = m.model.embed_tokens(self.tok.view(1, 1))
        for i, layer in enumerate(m.model.layers):
            a = layer.self_attn
            h = layer.input_layernorm(x)
            q = apply_rotary(a.q_proj(h).view(1, 1, a.n_head, a.hd), cos, sin)
            k = apply_rotary(a.k_proj(h).view(1, 1, a.n_kv, a.hd), cos, sin)
            v = a.v_proj(h).view(1, 1, a.n_kv, a.hd)
            kc, vc = c.get_layer_cache(i)
            kc.index_copy_(1, posl, k)
            vc.index_copy_(1, posl, v)
            x = x + a.o_proj(self._attend(q, kc, vc, pos).reshape(1, 1, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        self.logits.copy_(m.lm_head(m.model.norm(x))[0, 0])
        return self.logits
