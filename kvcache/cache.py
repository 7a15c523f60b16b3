"""A single-sequence KV cache in FlashAttention-3 layout.

The invariant the rest of the project leans on (see docs/cache-invariant.md):
positions [0, cache_seqlens) of k_cache/v_cache hold the K/V of exactly the first
cache_seqlens tokens of the conversation. Nothing past cache_seqlens is ever read,
so rewinding is just moving the counter back.
"""

from __future__ import annotations

import math
import mmap
import warnings

import torch


def zeros(shape: tuple[int, ...], device: torch.device | str, dtype: torch.dtype) -> torch.Tensor:
    """A zeroed tensor. On the CPU an anonymous mapping: the kernel's zero pages, so a 190 MB
    cache costs resident memory only as the chat fills it (torch.zeros writes every byte, and
    numpy's zeros asks for 2 MB huge pages, which a 15 KB write per layer faults in whole)."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, device=device, dtype=dtype)
    n = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    if n == 0:
        return torch.zeros(shape, dtype=dtype)
    with warnings.catch_warnings():   # the mapping is writable; torch warns for any buffer
        warnings.simplefilter("ignore")
        return torch.frombuffer(mmap.mmap(-1, n), dtype=torch.uint8).view(dtype).view(shape)


class CacheOverflow(RuntimeError):
    """A write would run past the cache's capacity. The cache is left untouched."""


class KVCache:
    """K/V for `num_layers` layers, shaped (num_layers, B, T, H, D), allocated once. On the CPU
    its memory is committed as the chat grows: a page at a time, as positions are written.

    `cache_seqlens` lives on the cache's device (FA3 reads it there); `seqlen` is its host
    mirror, equal to it at every moment, so that capacity checks never need a device sync.
    """

    def __init__(self, batch_size: int, num_heads: int, seq_len: int, head_dim: int,
                 num_layers: int, device: torch.device | str, dtype: torch.dtype):
        shape = (num_layers, batch_size, seq_len, num_heads, head_dim)
        self.k_cache = zeros(shape, device, dtype)
        self.v_cache = zeros(shape, device, dtype)
        self.cache_seqlens = torch.zeros(batch_size, dtype=torch.int32, device=device)
        self.seqlen = 0
        # Per-position model state (e.g. nanochat's previous-token embedding). Indexed by
        # position like K/V, so a rewind restores it for free.
        self.state: dict[str, torch.Tensor] = {}

    # --- the seed's API ------------------------------------------------------
    def get_layer_cache(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_cache[layer_idx], self.v_cache[layer_idx]

    def advance(self, num_tokens: int) -> None:
        self.check_fits(num_tokens)
        self.seqlen += num_tokens
        self.cache_seqlens.add_(num_tokens)

    def reset(self) -> None:
        self.rewind(0)

    # --- what a chat needs on top ---------------------------------------------
    def rewind(self, seqlen: int) -> None:
        """Keep the first `seqlen` positions, forget the rest. O(1): the tensors are not touched."""
        if not 0 <= seqlen <= self.seqlen:
            raise ValueError(f"cannot rewind to {seqlen}: cache holds {self.seqlen} tokens")
        self.seqlen = seqlen
        self.cache_seqlens.fill_(seqlen)

    def check_fits(self, num_tokens: int) -> None:
        if self.seqlen + num_tokens > self.capacity:
            raise CacheOverflow(
                f"KV cache full: {self.seqlen} + {num_tokens} tokens > capacity {self.capacity}")

    def add_state(self, name: str, per_position_shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """Allocate a per-position state buffer (B, T, *shape) next to K/V."""
        if name not in self.state:
            b, t = self.batch_size, self.capacity
            self.state[name] = zeros((b, t, *per_position_shape), self.device, dtype)  # lazy, as K/V
        return self.state[name]

    @property
    def num_layers(self) -> int:
        return self.k_cache.shape[0]

    @property
    def batch_size(self) -> int:
        return self.k_cache.shape[1]

    @property
    def capacity(self) -> int:
        return self.k_cache.shape[2]

    @property
    def free(self) -> int:
        return self.capacity - self.seqlen

    @property
    def device(self) -> torch.device:
        return self.k_cache.device

    @property
    def dtype(self) -> torch.dtype:
        return self.k_cache.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.k_cache.shape)

    @property
    def bytes_per_token(self) -> int:
        per_pos = 2 * self.k_cache[:, :, 0].numel() * self.k_cache.element_size()
        extra = sum(s[:, 0].numel() * s.element_size() for s in self.state.values())
        return per_pos + extra

    @property
    def bytes_allocated(self) -> int:
        return self.bytes_per_token * self.capacity

    @property
    def bytes_used(self) -> int:
        return self.bytes_per_token * self.seqlen
