"""The portable backend: `flash_attn_with_kvcache` semantics on top of PyTorch SDPA.

Runs anywhere (CPU, any GPU, any dtype). `pos` is the host copy of cache_seqlens (the cache's `seqlen`) for
batch 1, so slicing the cache needs no device sync on the decode path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# A CPU prefill attends in query chunks of this many, each over the keys it can see: torch's CPU
# kernel computes the masked half of a causal square too, and chunks skip most of it (pp512,
# one thread: 8.6 -> 6.0 ms a SmolLM2 layer, 13.1 -> 8.7 ms a Gemma 3 270M one; 128: 6.1 / 9.3).
CPU_QUERY_CHUNK = 64

# cuDNN's SDPA rebuilds its plan for every new key length (~7 ms of CPU a call when decoding),
# so on CUDA we let PyTorch choose among the others.
CUDA_SDPA = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def _visible_mask(pos: int, tq: int, tk: int, window_left: int, device) -> torch.Tensor | None:
    """Boolean (tq, tk) mask, bottom-right aligned: query i sits at absolute pos+i."""
    if tq == 1 and (window_left < 0 or window_left >= tk):
        return None  # a single query at the end sees every key: no mask needed
    qpos = torch.arange(pos, pos + tq, device=device)[:, None]
    kpos = torch.arange(tk, device=device)[None, :]
    mask = kpos <= qpos
    if window_left >= 0:
        mask &= kpos >= qpos - window_left
    return mask


def sdpa_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      k: torch.Tensor | None, v: torch.Tensor | None, pos: int,
                      causal: bool = True, window_size: tuple[int, int] = (-1, -1),
                      softcap: float = 0.0, softmax_scale: float | None = None) -> torch.Tensor:
    """q: (1, Tq, Hq, D); caches: (1, T, Hk, D); k/v: (1, Tq, Hk, D) appended at `pos`."""
    tq = q.shape[1]
    if k is not None:
        k_cache[:, pos:pos + tq] = k
        v_cache[:, pos:pos + tq] = v
    tk = pos + tq
    qh = q.transpose(1, 2)
    kh = k_cache[:, :tk].transpose(1, 2)
    vh = v_cache[:, :tk].transpose(1, 2)
    if kh.dtype != qh.dtype:   # an fp16 cache under fp32 activations (the quantized CPU path)
        kh, vh = kh.to(qh.dtype), vh.to(qh.dtype)
    gqa = kh.shape[1] != qh.shape[1]
    mask = _visible_mask(pos, tq, tk, window_size[0], q.device) if causal else None
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    if softcap > 0:
        if gqa:  # share each KV head among its query group
            rep = qh.shape[1] // kh.shape[1]
            kh, vh = kh.repeat_interleave(rep, dim=1), vh.repeat_interleave(rep, dim=1)
        scores = (qh.float() @ kh.float().transpose(-1, -2)) * scale
        scores = softcap * torch.tanh(scores / softcap)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        out = (scores.softmax(-1) @ vh.float()).to(q.dtype)
    elif q.is_cuda:
        with sdpa_kernel(CUDA_SDPA):
            out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale, enable_gqa=gqa)
    elif causal and tq > CPU_QUERY_CHUNK:
        out = _cpu_chunks(qh, kh, vh, pos, window_size[0], scale, gqa)
    else:
        # enable_gqa reads the shared KV heads in place: copying them per query head cost
        # 7.7 ms against 0.44 ms a layer at 4k tokens (SmolLM2 shape, 2-core CPU).
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale, enable_gqa=gqa)
    return out.transpose(1, 2)


_CHUNK_MASKS: dict[tuple[int, int, int, int], torch.Tensor] = {}


def _chunk_mask(q0: int, n: int, lo: int, window_left: int) -> torch.Tensor:
    """The additive (0 / -inf) mask of queries q0..q0+n over keys lo..q0+n, made once: every
    layer of a prefill asks for the same few, and building them (arange, compare, then SDPA's own
    bool-to-float conversion) was ~3% of a one-thread pp512."""
    key = (q0, n, lo, window_left)
    if (mask := _CHUNK_MASKS.get(key)) is None:
        if len(_CHUNK_MASKS) >= 512:
            _CHUNK_MASKS.clear()
        qpos = torch.arange(q0, q0 + n)[:, None]
        kpos = torch.arange(lo, q0 + n)[None, :]
        seen = kpos <= qpos
        if window_left >= 0:
            seen &= kpos >= qpos - window_left
        mask = _CHUNK_MASKS[key] = torch.zeros(seen.shape).masked_fill_(~seen, float("-inf"))
    return mask


def _cpu_chunks(qh: torch.Tensor, kh: torch.Tensor, vh: torch.Tensor, pos: int, window_left: int, scale: float,
                gqa: bool) -> torch.Tensor:
    """Causal attention of (1, H, Tq, D) queries at pos.. in chunks, each over only the keys
    [lo, its last query] it can see (lo > 0 inside a window)."""
    tq, outs = qh.shape[2], []
    for i in range(0, tq, CPU_QUERY_CHUNK):
        n = min(CPU_QUERY_CHUNK, tq - i)
        hi = pos + i + n
        lo = max(0, pos + i - window_left) if window_left >= 0 else 0
        mask = _chunk_mask(pos + i, n, lo, window_left).to(qh.dtype)
        outs.append(F.scaled_dot_product_attention(qh[:, :, i:i + n], kh[:, :, lo:hi], vh[:, :, lo:hi], attn_mask=mask,
                                                   scale=scale, enable_gqa=gqa))
    return torch.cat(outs, 2)
