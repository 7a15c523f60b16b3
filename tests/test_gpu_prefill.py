"""Prefill on CUDA: captured graphs at bucketed lengths, memory-sized chunks, Gemma's windowed layers.

The first test runs anywhere (the captured step's position, padding and last-row logic on the
CPU); the rest need CUDA (the H200, through the device tool).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from model.decode.generate import Generator
from model.decode.graph_config import GraphConfig
from model.decode.sampling import SamplingConfig
from model.loading import LoadOptions, load_model
from tests.gpu_helpers import assert_decode_noise, share_prefill

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.double() - ref.double()).norm() / ref.double().norm())


def rand_ids(n: int, seed: int, vocab: int = 200) -> torch.Tensor:
    return torch.randint(1, vocab, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("spec", ["random:tiny", "random:tiny-gemma3"])
def test_padded_prefill_step_equals_eager_over_a_cache(spec):
    """11 new tokens in a 16-token bucket after 20 cached ones (Gemma's 8-key window is crossed):
    the step's logits for the last real token and the K/V of every real position equal the eager
    forward's, and the padding's K/V (written past the end) are never read by the next token."""
    from model.decode.steps import prefill_step_for

    m = load_model(spec).model
    ref, cache = m.new_cache(64), m.new_cache(64)
    ids, new = rand_ids(20, 0), rand_ids(11, 1)
    with torch.inference_mode():
        m(ids[None], ref)
        m(ids[None], cache)
        want = m(new[None], ref, last=True)[0, -1]
        buf = rand_ids(16, 2)[None].clone()  # the 5 padding tokens: whatever a buffer held before
        buf[0, :11] = new
        last, logits = torch.tensor([10]), torch.zeros(m.config.vocab_size)
        step = prefill_step_for(m)(m, cache, buf, last, logits)
        got = step()
        assert cache.seqlen == 20  # the step leaves the cache to its caller
        cache.advance(11)
        assert rel_err(got, want) < 1e-5
        assert torch.allclose(cache.k_cache[:, :, :31], ref.k_cache[:, :, :31], atol=1e-5)
        assert torch.allclose(cache.v_cache[:, :, :31], ref.v_cache[:, :, :31], atol=1e-5)
        assert not torch.allclose(cache.k_cache[:, :, 31:36], ref.k_cache[:, :, 31:36])  # padding was written
        nxt = torch.tensor([[7]])
        assert rel_err(m(nxt, cache)[0, -1], m(nxt, ref)[0, -1]) < 1e-5


# --- GPU ------------------------------------------------------------------------------------
@functools.cache
def load_gpu(spec: str):
    return load_model(spec, LoadOptions(device="cuda", dtype=torch.bfloat16))


@pytest.fixture(scope="module")
def smol():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    yield load_gpu("random:smollm2-135m")
    load_gpu.cache_clear()


def ulps_below_top(logits: torch.Tensor, tok: int) -> float:
    top = float(logits.max())
    return float(top - logits[tok]) / 2.0 ** (torch.tensor(abs(top)).log2().floor().item() - 7)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("spec", ["random:smollm2-135m", "random:gemma3-270m"])
@pytest.mark.parametrize("history,n,step", [(0, 100, "fused"), (600, 100, "fused"), (600, 1, "fused"),
                                            (700, 5000, "fused"), (600, 100, "modules")])
def test_graph_prefill_equals_one_eager_forward(spec, history, n, step):
    """Graph prefill of n tokens (one padded bucket; 5,000: the largest bucket back to back, then
    a padded one) over `history` cached tokens equals ONE eager forward of the same n tokens over
    the same cache: logits within bf16 tolerance, the same argmax, and the same K/V at every real
    position. Both caches hold the very same history K/V, so only the new chunk's path differs.
    Measured on the H200 (random weights): 0 where FA3 sums in the same order (an empty cache,
    5,000 tokens), 5e-2 on SmolLM2 where eager's FA3 splits the keys (auto num_splits over 600+
    cached keys) and the graph pins one split; Gemma 1e-2. Random weights' near-flat logits
    amplify bf16 rounding (docs/gpu.md); a wrong position or key is off by O(1). `step`: the
    graphs capture the fused-kernel step (the default) or the model's own modules."""
    lm = load_gpu(spec)
    v = lm.tokenizer.vocab_size
    hist, new = rand_ids(history, 3, 30000).tolist(), rand_ids(n, 4, 30000).tolist()
    eager = Generator(lm.model, lm.model.new_cache(8192), v, graphs=None)
    cfg = GraphConfig(prefill_bucket=4096, prefill_fused=step == "fused")
    graph = Generator(lm.model, lm.model.new_cache(8192), v, graphs=cfg)
    assert graph.prefill_graphs is not None and graph.prefill_graphs.kind == step
    eager.prefill(hist)
    graph.cache.k_cache.copy_(eager.cache.k_cache)
    graph.cache.v_cache.copy_(eager.cache.v_cache)
    graph.cache.advance(history)
    eager.cache.check_fits(n)
    with torch.inference_mode():
        want = lm.model(torch.tensor([new], device="cuda"), eager.cache, last=True)[0, -1, :v]
    graph.prefill(new)
    got = graph.logits
    assert set(graph.prefill_graphs.graphs) >= ({4096} if n > 4096 else set())
    print(f"{spec} {step} history {history} + {n}: logits rel err {rel_err(got, want):.1e}, "
          f"buckets {sorted(graph.prefill_graphs.graphs)}, attention {lm.model.attn.name}")
    assert int(got.argmax()) == int(want.argmax())
    assert rel_err(got, want) < 0.1
    p = history + n
    for a, b in ((graph.cache.k_cache, eager.cache.k_cache), (graph.cache.v_cache, eager.cache.v_cache)):
        assert rel_err(a[:, :, :p], b[:, :, :p]) < 0.1
    assert graph.cache.seqlen == eager.cache.seqlen == p == int(graph.cache.cache_seqlens)


@pytest.mark.gpu
@cuda
def test_padded_bucket_then_graph_decode_equals_eager(smol):
    """100 tokens through the 128-token bucket (28 padding rows written past the end), then 60
    graph-decoded greedy tokens: teacher-forced, each is eager's argmax or within bf16 noise, and
    the decode step never reads the padding: its rows are overwritten with 1e4 before decoding,
    and eager decodes from the graph's prefill K/V (so only the decode step differs: the fused
    prefill's own 2-5e-2 on random weights moved a gap to 24 ulps when each side kept its own;
    shared, 20)."""
    v = smol.tokenizer.vocab_size
    hist, new = rand_ids(300, 5, 30000).tolist(), rand_ids(100, 6, 30000).tolist()
    graph = Generator(smol.model, smol.model.new_cache(1024), v, graphs=GraphConfig())
    eager = Generator(smol.model, smol.model.new_cache(1024), v, graphs=None)
    for g in (graph, eager):
        g.configure(SamplingConfig(temperature=0.0))
        g.prefill(hist)
        g.prefill(new)
    assert 128 in graph.prefill_graphs.graphs
    p = graph.cache.seqlen
    assert rel_err(graph.cache.k_cache[:, :, :p], eager.cache.k_cache[:, :, :p]) < 0.1   # H200: 3.9e-2
    pad = graph.cache.k_cache[:, :, p:p + 28]
    assert pad.abs().amax(dim=(0, 1, 3, 4)).min() > 0   # every padding row was written
    graph.cache.k_cache[:, :, p:p + 28] = 1e4
    graph.cache.v_cache[:, :, p:p + 28] = 1e4
    share_prefill(graph, eager, hist + new)
    gaps = []
    for _ in range(60):
        tok = graph.sample()
        gaps.append(ulps_below_top(eager.logits, tok))
        graph.feed(tok)
        eager.feed(tok)
    print(f"max gap {max(gaps):.1f} ulps, exact {sum(g == 0 for g in gaps)}/60")
    assert_decode_noise(gaps)   # H200: 20 ulps, 55/60 exact


@pytest.mark.gpu
@cuda
def test_gemma_windowed_prefill_equals_masked_reference_past_the_window():
    """The Triton window kernel serving a windowed layer's prefill over the cache: 300 queries at
    900..1199 with a 512-key window, against fp32 masked SDPA, within twice bf16 SDPA's own error;
    and keys just outside every query's window, poisoned with 1e4, change nothing."""
    from kvcache.sdpa import sdpa_with_kvcache
    from kvcache.window_attention import window_attention

    g = torch.Generator(device="cuda").manual_seed(0)
    start, tq, w, cap = 900, 300, 512, 1536
    q = torch.randn(1, tq, 4, 256, device="cuda", generator=g)
    kc, vc = (torch.randn(1, cap, 1, 256, device="cuda", generator=g) for _ in range(2))
    ref = sdpa_with_kvcache(q, kc.clone(), vc.clone(), None, None, start, window_size=(w - 1, 0))
    bq, bk, bv = q.bfloat16(), kc.bfloat16(), vc.bfloat16()
    sdpa_bf16 = sdpa_with_kvcache(bq, bk.clone(), bv.clone(), None, None, start, window_size=(w - 1, 0))
    at = torch.tensor([start], dtype=torch.int32, device="cuda")
    out = window_attention(bq, bk, bv, at, w - 1)
    print(f"rel err {rel_err(out, ref):.2e}, bf16 sdpa {rel_err(sdpa_bf16, ref):.2e}")  # H200: 3.5e-3, 3.2e-3
    assert rel_err(out, ref) <= 2 * rel_err(sdpa_bf16, ref)
    bk[:, :start - w + 1] = 1e4   # the oldest query (900) sees keys 389..900 only
    bv[:, :start - w + 1] = 1e4
    bk[:, start + tq:] = bv[:, start + tq:] = 1e4  # nor anything past the chunk
    assert torch.equal(window_attention(bq, bk, bv, at, w - 1), out)
    bk[:, start - w + 1] = 1e4    # the oldest key query 900 must see
    assert not torch.equal(window_attention(bq, bk, bv, at, w - 1), out)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("spec", ["random:smollm2-135m", "random:gemma3-270m"])
def test_8k_prefill_peak_memory_within_cache_plus_twice_the_weights(spec):
    """The whole process's peak reserved memory (every segment the caching allocator held: the
    graphs' pools, cuBLAS's workspaces, cached free blocks), from the model's load to the end of
    the first 8k prefill, in a fresh process as the bench measures it. The two shapes whose
    weights are small, so that any memory the prefill strands shows against the bound."""
    from chatapp.bench.gpu_memory import in_child

    r = in_child(spec, capacity=8192 + 128)
    assert "error" not in r, r
    print(f"{spec}: peak {r['peak_bytes'] / 1e6:.0f} MB reserved ({r['peak_allocated_bytes'] / 1e6:.0f} allocated) "
          f"<= {r['bound_bytes'] / 1e6:.0f} MB; buckets {r['buckets']}; stages {r['stages']}")
    assert r["cache_bytes"] > 0 and r["weight_bytes"] > 0 and max(r["buckets"]) >= 4096  # the 8k went through graphs
    assert r["peak_bytes"] <= r["bound_bytes"]


def test_the_app_asks_cuda_for_expandable_segments_unless_the_user_chose():
    """`model` sets PYTORCH_CUDA_ALLOC_CONF before CUDA starts (freed blocks are reused or unmapped
    instead of stranded: docs/gpu.md), and a user's own setting is kept."""
    code = "import os, model; print(os.environ['PYTORCH_CUDA_ALLOC_CONF'])"
    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
    run = functools.partial(subprocess.run, [sys.executable, "-c", code], cwd=root, capture_output=True,
                            text=True, timeout=60)
    assert run(env=env).stdout.strip() == "expandable_segments:True"
    assert run(env=dict(env, PYTORCH_CUDA_ALLOC_CONF="max_split_size_mb:64")).stdout.strip() == "max_split_size_mb:64"
