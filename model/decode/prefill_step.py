"""A prefill of B tokens at `cache_seqlens` in plain PyTorch: what a CUDA graph captures per bucket.

It runs the model's own modules (`qkv`, `o_proj`, the MLP, Gemma's `after_attention`), so it
matches the eager forward op for op; only the rotary rows and the cache slots come from
`cache_seqlens + arange(B)` on the device, and attention reads its key count there too. So one
capture per bucket length holds at any position.

The tokens past the real ones (the padding up to the bucket) are computed as well: their K/V
land at and past `cache_seqlens + n`, where the cache invariant says nothing is read (the
caller advances the cache by n only), and causal masking keeps them out of every real query.
The logits are computed for one row, `last` (a device index), and the step never advances the
cache itself.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvcache import Attention, KVCache
from kvcache.attention import window_kernel_runs


class PrefillAttention:
    """Causal attention of the bucket's queries over one layer's cache, their K/V already written.
    Flash where it serves the window (key count from the device), else the Triton window kernel
    (kvcache/window_attention.py), which reads only the window and serves full layers too. Where
    that cannot run (the CPU, in tests of the step itself; GPUs before sm_80) SDPA masks over the
    whole capacity."""

    def __init__(self, attn: Attention, cache: KVCache, num_splits: int = 1):
        probe = torch.empty(1, 1, 1, 1, device=cache.device, dtype=cache.dtype)
        flash = attn.flash
        self.flash = flash if flash is not None and flash.can_serve(probe, (-1, -1), 0.0) else None
        self.num_splits = num_splits  # pinned: capture and replay must agree
        self.names: set[str] = set()

    def __call__(self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, start: torch.Tensor,
                 seqlens_k: torch.Tensor, window: tuple[int, int]) -> torch.Tensor:
        if self.flash is not None and (window[0] < 0 or self.flash.windows):
            self.names.add(self.flash.name)
            return self.flash.fn(q, kc, vc, cache_seqlens=seqlens_k, causal=True, window_size=window,
                                 num_splits=self.num_splits)
        if not window_kernel_runs(q):
            return self.masked(q, kc, vc, start, window[0])
        from kvcache.window_attention import window_attention  # lazy: imports triton

        self.names.add("triton")
        return window_attention(q, kc, vc, start, window[0])

    @staticmethod
    def masked(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, start: torch.Tensor,
               window_left: int) -> torch.Tensor:
        kpos = torch.arange(kc.shape[1], device=q.device)[None, :]
        qpos = start.long() + torch.arange(q.shape[1], device=q.device)[:, None]
        mask = kpos <= qpos
        if window_left >= 0:
            mask = mask & (kpos >= qpos - window_left)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2),
                                             attn_mask=mask[None, None], enable_gqa=True)
        return out.transpose(1, 2)


class PrefillStep:
    """`step()` pushes `ids` (1, B) through the model at cache_seqlens and writes the logits of
    row `last` into `logits`. The caller advances the cache by the real token count."""

    def __init__(self, model: torch.nn.Module, cache: KVCache, ids: torch.Tensor, last: torch.Tensor,
                 logits: torch.Tensor, num_splits: int = 1):
        self.model, self.cache, self.ids, self.last, self.logits = model, cache, ids, last, logits
        b, dev = ids.shape[1], cache.device
        self.offsets = torch.arange(b, device=dev)
        self.seqlens_k = torch.zeros(1, dtype=torch.int32, device=dev)
        self.attend = PrefillAttention(model.attn, cache, num_splits)

    def positions(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(cache rows, rotary rows) of the bucket's tokens; sets the key count flash reads."""
        pos = self.cache.cache_seqlens
        torch.add(pos, self.ids.shape[1], out=self.seqlens_k)
        rows = pos.long() + self.offsets
        return rows, rows.clamp(max=self.model.rope_length() - 1)  # the tables' rows (they follow the cache)

    def write(self, i: int, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        kc, vc = self.cache.get_layer_cache(i)
        kc.index_copy_(1, rows, k)
        vc.index_copy_(1, rows, v)
        return kc, vc

    def __call__(self) -> torch.Tensor:
        rows, rope_rows = self.positions()
        x = self.layers(rows, rope_rows)
        self.logits.copy_(self.head(x.index_select(1, self.last))[0, 0])
        return self.logits


class LlamaPrefillStep(PrefillStep):
    def layers(self, rows: torch.Tensor, rope_rows: torch.Tensor) -> torch.Tensor:
        m, pos = self.model, self.cache.cache_seqlens
        cos_t, sin_t = m.rope(pos.device)
        cos, sin = cos_t.index_select(0, rope_rows), sin_t.index_select(0, rope_rows)
        x = m.model.embed_tokens(self.ids)
        b = x.shape[1]
        for i, layer in enumerate(m.model.layers):
            a = layer.self_attn
            q, k, v = a.qkv(layer.input_layernorm(x), cos, sin)
            kc, vc = self.write(i, rows, k, v)
            x = x + a.o_proj(self.attend(q, kc, vc, pos, self.seqlens_k, (-1, -1)).reshape(1, b, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return x

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(self.model.model.norm(x)).float()


class GemmaPrefillStep(PrefillStep):
    def layers(self, rows: torch.Tensor, rope_rows: torch.Tensor) -> torch.Tensor:
        m, pos = self.model, self.cache.cache_seqlens
        rope = {sliding: (cos.index_select(0, rope_rows), sin.index_select(0, rope_rows))
                for sliding, (cos, sin) in m.rope(pos.device).items()}
        x = m.embed(self.ids)
        b = x.shape[1]
        for i, layer in enumerate(m.model.layers):
            a = layer.self_attn
            q, k, v = a.qkv(layer.input_layernorm(x), *rope[layer.sliding])
            kc, vc = self.write(i, rows, k, v)
            out = self.attend(q, kc, vc, pos, self.seqlens_k, a.window)
            x = layer.after_attention(x, a.o_proj(out.reshape(1, b, -1)))
        return x

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.head(x)
