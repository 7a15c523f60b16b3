"""The fused Triton decode kernels on the CPU, through Triton's interpreter.

The same kernels the H200 runs (norm+QKV+rotary+cache write, split-KV attention with its
in-kernel merge, the GEMVs with their fused norm, SwiGLU and residual) checked against the
eager PyTorch forward of a tiny random model. Skipped where Triton is not installed.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parent.parent


def test_fused_step_in_the_interpreter_matches_eager():
    # Four splits of 128-key blocks (head_dim 16). 20 tokens: one block, one split. 150: two
    # splits, merged by the last one to finish. 1500: 12 blocks, so each split walks three.
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "kernels_interpret.py"), "20", "150", "1500"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    assert [r["prompt"] for r in rows] == [20, 20, 150, 150, 1500, 1500]
    assert {(r["splits"], r["block"]) for r in rows} == {(4, 128)}
    for r in rows:
        assert r["rel_err"] < 1e-5, r     # fp32: only the summation order differs
        assert r["argmax_equal"], r
    assert all(r["cache_max_diff"] < 1e-5 for r in rows if "cache_max_diff" in r)


@pytest.mark.parametrize("spec", ["random:tiny-qwen2", "random:tiny-qwen3"])
def test_fused_step_with_biases_or_head_norms_matches_eager(spec):
    """Qwen2's q/k/v biases inside norm_qkv_rope; Qwen3's per-head q/k RMSNorm (head_dim 32
    against hidden/heads of 16, untied head) through norm_gemv + head_norm_rope."""
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "kernels_interpret.py"), "--model", spec, "20", "150"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    assert [r["prompt"] for r in rows] == [20, 20, 150, 150]
    for r in rows:
        assert r["rel_err"] < 1e-5 and r["argmax_equal"], r
    assert all(r["cache_max_diff"] < 1e-5 for r in rows if "cache_max_diff" in r)


def test_decode_attention_at_the_key_block_edges():
    """Split-KV attention alone against a float64 softmax wherever the newest key starts,
    ends or sits alone in a block or a split, with 64- and 128-key blocks and 1-24 live
    splits (both shapes of the merge); and sliding windows read in place, past their edge."""
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "kernels_interpret.py"), "attention"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    assert {(r["d"], r["block"]) for r in rows} == {(16, 128), (64, 128), (128, 64)}
    assert {r["splits"] for r in rows} == {1, 2, 4, 32} and {0, 63, 64, 127, 128, 129} <= {r["pos"] for r in rows}
    live = {r["live"] for r in rows}
    assert {1, 2, 3, 4} <= live and max(live) > 16   # both merge shapes, and the single split
    assert {r["pos"] for r in rows if r.get("window")} >= {199, 200, 201}   # windows read in place
    for r in rows:
        assert r["rel_err"] < 1e-5 and r["counters_reset"], r


def test_greedy_pick_is_torch_argmax():
    """The argmax that ends the captured step: the first of equal maxima, across its blocks,
    written to the step's token and to the host slot of the position (and nowhere else)."""
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "kernels_interpret.py"), "greedy"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(rows) == 5
    for r in rows:
        assert r["got"] == r["host"] == r["want"] and r["others_untouched"], r
    assert {r["want"] for r in rows if r["case"].startswith("tie")} == {5, 40}


def test_window_prefill_attention_reads_exactly_the_window():
    """The prefill kernel for windowed layers (kvcache/window_attention.py) against a float64
    masked softmax, at chunk starts before, at and past the window, head sizes that are and are
    not powers of two, with blocks that put window edges inside a block and across several."""
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "kernels_interpret.py"), "window"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(rows) == 12 and {r["window"] for r in rows} == {8, -1, 50, 200, 31}
    for r in rows:
        assert r["rel_err"] < 1e-5, r    # fp32 (IEEE products): only the summation order differs


def test_fused_prefill_step_matches_eager_over_a_cache():
    """The captured prefill step's fused kernels (residual + RMSNorm, rotary + cache write with
    Gemma's head norms, SiLU/GELU * up) for Llama, Qwen2 (q/k/v biases), Gemma 3 (post-norms, an
    8-key window crossed, q rescaled) and 10 head slots in a 16-row tile: a padded 16-token
    bucket after 20 cached tokens against the eager forward, fp32, and the next token after it
    (the padding's K/V, written, are never read; nothing lands past the bucket)."""
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "kernels_interpret.py"), "prefill"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    assert [r["step"] for r in rows] == ["LlamaFusedPrefillStep"] * 2 + ["GemmaFusedPrefillStep",
                                                                      "LlamaFusedPrefillStep"]
    for r in rows:
        assert r["rel_err"] < 1e-5 and r["next_rel_err"] < 1e-5 and r["kv_max_diff"] < 1e-4, r
        assert r["padding_written"] and r["beyond_untouched"], r   # nothing past the bucket's 16 rows


def test_gate_up_gemm_with_the_activation_in_its_epilogue_matches_linear_then_glu():
    """The fused gate/up GEMM the prefill takes where it measures faster (model/decode/glu_gemm.py):
    masked row/column/K tails and whole tiles, SiLU and GELU, against F.linear then act * up."""
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "kernels_interpret.py"), "glu_gemm"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(rows) == 4
    for r in rows:
        assert r["shape"] == [r["t"], r["f"]] and r["max_err"] < 1e-5, r
