"""KVCache: the seed's API, rewind, capacity and byte accounting."""

import pytest
import torch

from kvcache import CacheOverflow, KVCache
from model.loading.options import LoadOptions


def make(cap=32):
    return KVCache(batch_size=1, num_heads=3, seq_len=cap, head_dim=8, num_layers=4,
                   device="cpu", dtype=torch.float32)


def test_layout_and_views():
    c = make()
    assert c.k_cache.shape == (4, 1, 32, 3, 8) and c.v_cache.shape == (4, 1, 32, 3, 8)
    assert c.cache_seqlens.dtype == torch.int32 and c.cache_seqlens.shape == (1,)
    k, v = c.get_layer_cache(2)
    k[0, 5, 1, 3] = 7.0  # a view: writes land in the big tensor, no copy
    assert c.k_cache[2, 0, 5, 1, 3] == 7.0
    assert k.data_ptr() == c.k_cache[2].data_ptr() and v.data_ptr() == c.v_cache[2].data_ptr()


def test_advance_rewind_reset_and_bytes():
    c = make()
    per_token = 2 * 4 * 3 * 8 * 4
    assert c.bytes_allocated == per_token * 32 and c.bytes_used == 0
    c.advance(10)
    assert c.seqlen == 10 and int(c.cache_seqlens[0]) == 10 and c.free == 22
    assert c.bytes_used == per_token * 10
    c.k_cache.fill_(1.0)
    c.rewind(4)
    assert c.seqlen == 4 and int(c.cache_seqlens[0]) == 4
    assert bool((c.k_cache == 1.0).all())  # O(1): the tensors are not touched
    with pytest.raises(ValueError):
        c.rewind(5)
    c.reset()
    assert c.seqlen == 0 and int(c.cache_seqlens[0]) == 0 and c.capacity == 32


def test_overflow_is_clear_and_changes_nothing():
    c = make(8)
    c.advance(6)
    with pytest.raises(CacheOverflow, match="6 \\+ 3 tokens > capacity 8"):
        c.advance(3)
    assert c.seqlen == 6 and int(c.cache_seqlens[0]) == 6


def test_state_buffers_count_in_bytes():
    c = make()
    base = c.bytes_per_token
    c.add_state("prev_emb", (16,), torch.float32)
    assert c.bytes_per_token == base + 16 * 4


def rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


@pytest.mark.parametrize("spec", ["random:tiny", "random:tiny-gemma3"])
def test_the_cpu_cache_commits_memory_as_the_chat_grows(spec):
    """Issue 44: a cache of the model's whole context costs memory only for the positions written
    (gemma3-270m's 32k context is 576 MiB of KV). 512 MiB reserved: RSS grows by the KV of the
    tokens prefilled and a page per layer, not by the reservation. (The rotary tables follow the
    capacity, computed at the first forward: measured from after it.)"""
    from model.loading import load_model

    lm = load_model(spec, LoadOptions(dtype=torch.float32))
    per_token = lm.model.new_cache(1).bytes_per_token
    before = rss()
    cache = lm.model.new_cache((512 << 20) // per_token)
    assert cache.bytes_allocated >= 500 << 20 and rss() - before < 16 << 20
    with torch.no_grad():
        lm.model(torch.tensor([[1]]), cache)  # the rotary tables, as long as the cache
        cache.rewind(0)
        before = rss()
        lm.model(torch.randint(0, 256, (1, 200)), cache)
    assert cache.seqlen == 200 and rss() - before < cache.bytes_used + (16 << 20)


def test_per_position_state_is_committed_as_written_too():
    c = make(cap=1 << 22)
    before = rss()
    ids = c.add_state("ids", (), torch.long)   # nanochat's previous-token ids: 32 MiB reserved
    ids[0, :100] = 7
    assert rss() - before < 4 << 20 and int(ids[0, 99]) == 7 and int(ids[0, 100]) == 0
