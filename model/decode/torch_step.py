"""The plain-PyTorch decode step of every family: the family's own forward, one token, with
its position read from the device.

`TorchStep` runs `model(token, cache, step=attend)`: the forward's modules, op for op, with the
rotary rows and the cache slot taken from `cache_seqlens` instead of the host mirror and K/V
written there by `StepAttention`. No shape depends on the position, so a CUDA graph of it holds
at any position: the plain-graph baseline in the benchmark, and the reference the fused Triton
steps are checked against, on any device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvcache import Attention, KVCache


class StepAttention:
    """The attention call of a capturable one-token decode step, with `kvcache.Attention`'s
    signature so a family's forward takes either: the new token, at position `cache_seqlens` (the
    device tensor `start` is given), is written into the layer's cache and attends to it. Flash reads the
    key count from `seqlens_k`; SDPA masks over the whole capacity."""

    def __init__(self, attn: Attention, cache: KVCache, num_splits: int = 1):
        dev = cache.device
        probe = torch.empty(1, 1, 1, 1, device=dev, dtype=cache.dtype)
        flash = attn.flash
        self.flash = flash if flash is not None and flash.can_serve(probe, (-1, -1), 0.0) else None
        self.num_splits = num_splits  # pinned: capture and replay must agree
        self.key_pos = torch.arange(cache.capacity, device=dev)
        self.seqlens_k = torch.zeros(1, dtype=torch.int32, device=dev)
        self.name = self.flash.name if self.flash else "sdpa"
        self.cache_seqlens = self.seqlens_long = cache.cache_seqlens

    def start(self, cache_seqlens: torch.Tensor) -> None:
        """Once a step, before its layers: the position, and the key count flash reads (the new
        token included)."""
        self.cache_seqlens, self.seqlens_long = cache_seqlens, cache_seqlens.long()
        torch.add(cache_seqlens, 1, out=self.seqlens_k)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache, layer_idx: int,
                 causal: bool = True, window_size: tuple[int, int] = (-1, -1)) -> torch.Tensor:
        """q: (1, 1, Hq, D); k, v: (1, 1, Hk, D), written at `cache_seqlens` before attending."""
        kc, vc = cache.get_layer_cache(layer_idx)
        kc.index_copy_(1, self.seqlens_long, k)
        vc.index_copy_(1, self.seqlens_long, v)
        if self.flash is not None and (window_size == (-1, -1) or self.flash.windows):
            return self.flash.fn(q, kc, vc, cache_seqlens=self.seqlens_k, causal=True, window_size=window_size,
                                 num_splits=self.num_splits)
        mask = self.key_pos <= self.cache_seqlens
        if window_size[0] >= 0:
            mask = mask & (self.key_pos >= self.cache_seqlens - window_size[0])
        out = F.scaled_dot_product_attention(q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2),
                                             attn_mask=mask[None, None, None, :], enable_gqa=True)
        return out.transpose(1, 2)


class TorchStep:
    """`step()` feeds `token` at position cache_seqlens and writes `logits`. It does not advance
    the cache: the caller does (`cache.advance(1)`) once the token is really fed."""

    name = "torch"

    def __init__(self, model: torch.nn.Module, cache: KVCache, num_splits: int = 1):
        self.model, self.cache = model, cache
        dev = cache.device
        self.token = torch.zeros(1, dtype=torch.long, device=dev)
        self.logits = torch.zeros(model.config.vocab_size, dtype=torch.float32, device=dev)
        self.attend = StepAttention(model.attn, cache, num_splits)
        self.attn_name = self.attend.name

    def __call__(self) -> torch.Tensor:
        self.attend.start(self.cache.cache_seqlens)
        self.logits.copy_(self.model(self.token.view(1, 1), self.cache, step=self.attend)[0, 0])
        return self.logits
