"""The CPU prefill's causal attention in C (model/cpu/prefill_attn.c): it equals a float64
softmax over the same fp16 cache within a stated bound, on every build (AVX-512, portable C,
clang); any thread count gives the same bits; its bf16 products (the bf16 prefill's) are within
bf16's rounding of it; and a Gemma prefill through it (sliding windows, GQA, q/k norms, a cache
already holding a turn) follows the fp32 reference."""

from __future__ import annotations

import shutil

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from helpers import assert_close_logits, both

from model.cpu import native, prefill_attn, prefill_gemm

pytestmark = pytest.mark.skipif(prefill_gemm.lib() is None, reason=f"CPU kernels unavailable: {native.why_not()}")

# fp32 scores, softmax and sums over at most a few hundred keys of unit-scale values: the
# largest difference to float64 seen is 4e-6
BOUND = 2e-5

SHAPES = [   # (queries, position, query heads, KV heads, head_dim, keys before a query a window keeps)
    (70, 0, 9, 3, 64, -1),      # SmolLM2's heads, a partial query block
    (33, 100, 4, 1, 256, 50),   # Gemma 3's, windowed, after a cached turn
    (2, 7, 2, 2, 16, -1),       # a two-token turn
    (100, 0, 4, 1, 256, 40),    # the window inside the first prefill
]


@pytest.fixture(scope="module")
def builds() -> dict:
    out = {"default": prefill_attn.bind(prefill_gemm.lib()),
           "portable": prefill_attn.bind(native.build(["-O3", "-fopenmp", "-pthread"]))}
    if shutil.which("clang"):
        out["clang"] = prefill_attn.bind(native.build(["-O3", "-march=native", "-pthread"], cc="clang"))
    return out


def case(t: int, pos: int, hq: int, hk: int, d: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    cap = pos + t + 5
    kc = torch.randn(1, cap, hk, d, generator=g).half()
    vc = torch.randn(1, cap, hk, d, generator=g).half()
    return torch.randn(1, t, hq, d, generator=g) * 2, kc, vc


def reference(q, kc, vc, pos: int, wl: int, scale: float) -> torch.Tensor:
    """softmax(q k^T scale) v in float64, each query at pos + i seeing keys [pos + i - wl, pos + i]."""
    t, hq = q.shape[1], q.shape[2]
    rep = hq // kc.shape[2]
    k = kc[0, :pos + t].double().repeat_interleave(rep, 1).transpose(0, 1)   # (hq, keys, d)
    v = vc[0, :pos + t].double().repeat_interleave(rep, 1).transpose(0, 1)
    s = q[0].double().transpose(0, 1) @ k.transpose(1, 2) * scale
    qp, kp = torch.arange(pos, pos + t)[:, None], torch.arange(pos + t)[None]
    seen = (kp <= qp) & ((kp >= qp - wl) if wl >= 0 else True)
    return (s.masked_fill(~seen, float("-inf")).softmax(-1) @ v).transpose(0, 1)[None]


@pytest.mark.parametrize("shape", SHAPES)
def test_attention_equals_a_float64_reference_on_every_build(builds, shape):
    t, pos, hq, hk, d, wl = shape
    q, kc, vc = case(t, pos, hq, hk, d)
    want = reference(q, kc, vc, pos, wl, d ** -0.5)
    for name, lib in builds.items():
        got = prefill_attn.attend(lib, q, kc, vc, pos, wl, d ** -0.5, 2)
        assert got is not None, name
        assert (got.double() - want).abs().max().item() <= BOUND, name


def test_thread_counts_give_the_same_bits(builds):
    q, kc, vc = case(150, 20, 4, 1, 256, seed=3)
    for lib in builds.values():
        one = prefill_attn.attend(lib, q, kc, vc, 20, 60, 0.0625, 1)
        assert all(torch.equal(one, prefill_attn.attend(lib, q, kc, vc, 20, 60, 0.0625, n)) for n in (2, 3))


def test_shapes_the_kernel_does_not_serve_return_none(builds):
    lib = builds["default"]
    q, kc, vc = case(4, 0, 2, 2, 24)   # head_dim not a multiple of 16
    assert prefill_attn.attend(lib, q, kc, vc, 0, -1, 0.2, 2) is None


# bf16 q, k, softmax weights and v: each rounding is within 2^-9 of its value, so an output, a
# weighted mean of unit-scale values, moves by a few 1e-3 (seen: up to 9e-3 at 512 keys)
BF16_BOUND = 0.03
BF16_SHAPES = [s for s in SHAPES if s[4] % 32 == 0] + [(40, 300, 16, 8, 128, -1)]


def bf16_builds(builds: dict) -> dict:
    """The builds whose kernels have the bf16 products (AVX-512 BF16): the default and clang's here."""
    q, kc, vc = case(2, 0, 1, 1, 32)
    return {n: lib for n, lib in builds.items() if prefill_attn.attend(lib, q, kc, vc, 0, -1, 1.0, 1, True) is not None}


@pytest.mark.parametrize("shape", BF16_SHAPES)
def test_bf16_attention_is_the_float64_softmax_within_bf16s_rounding(builds, shape):
    """The bf16 prefill's attention: keys no query may see (the future, before every window) hold
    huge values, so a key seen by mistake would show far past the bound."""
    libs = bf16_builds(builds)
    if not libs:
        pytest.skip("no AVX-512 BF16 on this CPU or build")
    t, pos, hq, hk, d, wl = shape
    q, kc, vc = case(t, pos, hq, hk, d, seed=5)
    qp, kp = torch.arange(pos, pos + t)[:, None], torch.arange(pos + t)[None]
    unseen = ~((kp <= qp) & ((kp >= qp - wl) if wl >= 0 else True)).any(0)
    vc[:, :pos + t][:, unseen] = 1e4
    vc[:, pos + t:] = 1e4   # the rows past the chunk (the cache's free room)
    want = reference(q, kc, vc, pos, wl, d ** -0.5)
    for name, lib in libs.items():
        got = [prefill_attn.attend(lib, q, kc, vc, pos, wl, d ** -0.5, n, True) for n in (1, 2, 3)]
        assert all(torch.equal(got[0], g) for g in got[1:]), name   # the same bits on any thread count
        err = (got[0].double() - want).abs().max().item()
        assert err <= BF16_BOUND, name
        assert err > BOUND, name   # the products really are bf16 (the fp32 kernel is within 2e-5)
    for lib in libs.values():   # d % 32 != 0: not this kernel's
        assert prefill_attn.attend(lib, *case(4, 0, 2, 2, 48), 0, -1, 0.2, 2, True) is None


def test_a_gemma_chat_prefills_through_it_and_follows_the_reference(tmp_path, home, monkeypatch):
    """Two turns of a tiny Gemma 3 (windows of 6 keys on five layers in six, 4 query heads over
    2 KV heads, q/k norms), each prefilled through the C attention on top of the cache the first
    left, give the fp32 reference's logits; 1 and 2 threads the same bits; NANOCHAT_QGEMM=0 keeps
    PyTorch's attention."""
    from gemma_tiny import save_tiny
    from gemma_tiny import write_gguf as write_gemma

    monkeypatch.setenv("NANOCHAT_QGEMM", "1")   # the GEMM and the attention on any build
    q, ref = both(write_gemma(tmp_path / "gemma.gguf", save_tiny(tmp_path / "hf"), Q.Q8_0))
    calls = []
    real = prefill_attn.attend
    monkeypatch.setattr(prefill_attn, "attend", lambda *a: calls.append(a[4]) or real(*a))
    qc, rc = q.model.new_cache(96), ref.model.new_cache(96)
    t = q.template
    for turn in (t.start("") + t.user_turn("hello there how are you"), t.user_turn("the capital of France is")):
        with torch.no_grad():
            assert_close_logits(q.model(torch.tensor([turn]), qc, last=True)[0, -1],
                                ref.model(torch.tensor([turn]), rc, last=True)[0, -1])
    assert calls and min(calls) == 0 and max(calls) > 6   # both turns, the second past the window
    torch.testing.assert_close(qc.k_cache[:, :, :qc.seqlen].float(), rc.k_cache[:, :, :rc.seqlen], atol=2e-2, rtol=2e-2)
    # the whole prefill (GEMMs, attention, norms, rotary) gives the same bits on 1 and 2 threads
    threads, runs = torch.get_num_threads(), []
    ids = torch.tensor([t.start("") + t.user_turn("hello there how are you") * 3])
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            cache = q.model.new_cache(96)
            with torch.no_grad():
                runs.append((q.model(ids, cache), cache.k_cache.clone(), cache.v_cache.clone()))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))
    monkeypatch.setenv("NANOCHAT_QGEMM", "0")
    calls.clear()
    with torch.no_grad():
        q.model(torch.tensor([t.user_turn("ok")]), qc, last=True)
    assert not calls
    monkeypatch.setenv("NANOCHAT_QGEMM", "1")
    q.model.attn.requested = "sdpa"   # --attn sdpa: the backend asked for by name
    with torch.no_grad():
        q.model(torch.tensor([t.user_turn("ok")]), qc, last=True)
    assert not calls
