"""The SDPA backend against a naive fp32 reference with flash_attn_with_kvcache semantics."""

import pytest
import torch

from kvcache import Attention, CacheOverflow, KVCache
from kvcache.sdpa import sdpa_with_kvcache


def reference(q, k_all, v_all, pos, window_left=-1, softcap=0.0):
    """Naive attention: query i (absolute pos+i) sees keys j <= pos+i (and within the window)."""
    b, tq, hq, d = q.shape
    hk = k_all.shape[2]
    k = k_all.repeat_interleave(hq // hk, dim=2).double()
    v = v_all.repeat_interleave(hq // hk, dim=2).double()
    out = torch.zeros(b, tq, hq, d, dtype=torch.float64)
    for i in range(tq):
        qi = pos + i
        lo = 0 if window_left < 0 else max(0, qi - window_left)
        s = torch.einsum("bhd,bjhd->bhj", q[:, i].double(), k[:, lo:qi + 1]) * d ** -0.5
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        out[:, i] = torch.einsum("bhj,bjhd->bhd", s.softmax(-1), v[:, lo:qi + 1])
    return out.float()


def run_chunks(chunks, hq=6, hk=2, d=16, cap=64, window_left=-1, softcap=0.0, seed=0):
    """Feed chunk sizes one after another into a cache; compare every output with the reference."""
    g = torch.Generator().manual_seed(seed)
    total = sum(chunks)
    q_all = torch.randn(1, total, hq, d, generator=g)
    k_all = torch.randn(1, total, hk, d, generator=g)
    v_all = torch.randn(1, total, hk, d, generator=g)
    kc, vc = torch.zeros(1, cap, hk, d), torch.zeros(1, cap, hk, d)
    pos = 0
    for n in chunks:
        sl = slice(pos, pos + n)
        out = sdpa_with_kvcache(q_all[:, sl], kc, vc, k_all[:, sl], v_all[:, sl], pos,
                                window_size=(window_left, 0), softcap=softcap)
        ref = reference(q_all[:, sl], k_all[:, :pos + n], v_all[:, :pos + n], pos, window_left, softcap)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        pos += n
    torch.testing.assert_close(kc[:, :total], k_all)  # appended in place, at the right positions


@pytest.mark.parametrize("chunks", [[17], [1, 1, 1], [10, 1, 1, 7, 1], [5, 12, 3]])
def test_prefill_decode_and_chunks_on_nonempty_cache(chunks):
    run_chunks(chunks)


def test_gqa_and_mha():
    run_chunks([9, 1, 4], hq=8, hk=8)
    run_chunks([9, 1, 4], hq=8, hk=1)


@pytest.mark.parametrize("window", [0, 3, 8])
def test_sliding_window(window):
    run_chunks([12, 1, 1, 6, 1], window_left=window)


@pytest.mark.parametrize("window", [-1, 40])
def test_long_cpu_prefills_attend_in_query_chunks(window):
    """Past CPU_QUERY_CHUNK queries the CPU attends chunk by chunk over the keys each can see
    (a window's start included), on an empty cache and after other tokens."""
    run_chunks([150, 1, 70, 66], cap=300, window_left=window)


def test_softcap():
    run_chunks([7, 1, 5], softcap=2.0)


def test_causal_alignment_is_bottom_right():
    """A 3-token chunk after 5 cached tokens: its first query must see exactly 6 keys."""
    kc, vc = torch.zeros(1, 16, 1, 4), torch.zeros(1, 16, 1, 4)
    vc[:, :8, 0, 0] = torch.arange(8, dtype=torch.float)
    q = torch.zeros(1, 3, 1, 4)  # uniform attention: output = mean of visible values
    k = torch.zeros(1, 3, 1, 4)
    v = vc[:, 5:8].clone()
    out = sdpa_with_kvcache(q, kc, vc, k, v, pos=5)
    assert out[0, :, 0, 0].tolist() == pytest.approx([2.5, 3.0, 3.5])


def test_router_overflow_leaves_cache_untouched():
    cache = KVCache(1, 2, 8, 4, 1, "cpu", torch.float32)
    attn = Attention("sdpa")
    x = torch.randn(1, 6, 2, 4)
    attn(x, x, x, cache, 0)
    cache.advance(6)
    before = cache.k_cache.clone()
    with pytest.raises(CacheOverflow, match="capacity 8"):
        cache.check_fits(3)
    assert cache.seqlen == 6 and int(cache.cache_seqlens[0]) == 6
    assert torch.equal(cache.k_cache, before)


def test_forcing_an_unavailable_backend_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine may have FA2")
    with pytest.raises(RuntimeError, match="not available"):
        Attention("fa2")
    assert Attention("auto").name == "sdpa"
