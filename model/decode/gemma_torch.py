"""Gemma 3's decode step in plain PyTorch, with the position read from the device.

It runs the model's own modules (`GemmaAttention.qkv`, `GemmaBlock.after_attention`), so it
matches the eager forward op for op; only the rotary rows and the cache slot come from
`cache_seqlens`, and windowed layers are masked by `StepAttention` (or the flash kernel's
own window), so a CUDA graph of it holds at any position.
"""

from __future__ import annotations

import torch

from kvcache import KVCache
from model.families.gemma import Gemma
from model.families.layers import StepAttention


class GemmaTorchStep:
    """Feed `tok` at cache_seqlens and write `logits`; the caller advances the cache."""

    name = "torch"

    def __init__(self, model: Gemma, cache: KVCache, num_splits: int = 1):
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
        rope = {sliding: (cos.index_select(0, posl), sin.index_select(0, posl))
                for sliding, (cos, sin) in m.rope(pos.device).items()}
        x = m.embed(self.tok.view(1, 1))
        for i, layer in enumerate(m.model.layers):
            a = layer.self_attn
            q, k, v = a.qkv(layer.input_layernorm(x), *rope[layer.sliding])
            kc, vc = c.get_layer_cache(i)
            kc.index_copy_(1, posl, k)
            vc.index_copy_(1, posl, v)
            x = layer.after_attention(x, a.o_proj(self.attend(q, kc, vc, pos, a.window).reshape(1, 1, -1)))
        self.logits.copy_(m.head(x)[0, 0])
        return self.logits
