"""The CPU-time benches (chatapp/bench/cputime.py, gemv_rates.py) on the tiny llama-quantize file:
llama.cpp's cost a token from two runs' child CPU time, ours from the real C step, and two
builds of the kernels compared on the same matrices."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import cpu_burning_llama_bench

from chatapp.bench import cputime, gemv_rates
from model.cpu import native

TINY = Path(__file__).parent / "data" / "tiny_llama_q3_k_m.gguf"
pytestmark = pytest.mark.skipif(native.library() is None, reason=f"CPU kernels unavailable: {native.why_not()}")


def test_llama_cost_a_token_cancels_the_fixed_part(tmp_path):
    binary = cpu_burning_llama_bench(tmp_path, 4.0)
    ms = cputime.llama_ms(binary, "unused.gguf", 0, 8)
    assert 3.0 < ms < 5.0   # 4 ms a token; without the difference it would read 4 + 60/24


def test_cputime_runs_ours_on_the_c_step(tmp_path, capsys):
    # 4 ms a token over 16 tokens' difference: the stand-in's start-up varies by a few ms of CPU
    # between its two runs on a loaded machine, which at 1 ms over 8 tokens read as 1.59 ms
    cputime.main([str(TINY), "--depth", "0,16", "--tokens", "8", "--rounds", "1",
                  "--llama-bench", cpu_burning_llama_bench(tmp_path, 4.0)])
    out = capsys.readouterr().out
    rows = re.findall(r"depth (\d+): ours ([\d.]+) ms .* llama.cpp ([\d.]+) ms .* llama.cpp / ours ([\d.]+)x", out)
    assert [r[0] for r in rows] == ["0", "16"], out
    assert all(float(o) > 0 and 3.0 < float(p) < 5.0 for _, o, p, _ in rows), out


def test_gemv_rates_compares_builds_on_the_same_matrices(capsys):
    gemv_rates.main([str(TINY), "--build", "", "--build=-DPF_FAR=0", "--rounds", "1", "--step", "4"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and "[this checkout]" in lines[0] and "[-DPF_FAR=0]" in lines[1]
    for line in lines:
        assert "head" in line and all(float(v) > 0 for v in re.findall(r"MB ([\d.]+)", line))
    # a prefetch distance changes no result: the second build's logits equal the first's
    assert lines[1].endswith("logits vs first build 0"), lines[1]
