"""The prefill CPU-time bench (chatapp/bench/prefill_cputime.py) on the tiny llama-quantize file:
ours from the app's real prefill, llama.cpp's from two runs' child CPU time (-r 4 and -r 1),
whose difference cancels its loading."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import cpu_burning_llama_bench

from chatapp.bench import prefill_cputime
from model.cpu import native

TINY = Path(__file__).parent / "data" / "tiny_llama_q3_k_m.gguf"
pytestmark = pytest.mark.skipif(native.library() is None, reason=f"CPU kernels unavailable: {native.why_not()}")


def test_prefill_cputime_times_ours_and_cancels_llamas_fixed_part(tmp_path, capsys):
    prefill_cputime.main([str(TINY), "--pp", "24", "--rounds", "1",
                          "--llama-bench", cpu_burning_llama_bench(tmp_path, 40.0, per="-r")])
    out = capsys.readouterr().out
    m = re.search(r"ours ([\d.]+) ms .* llama.cpp ([\d.]+) ms .* llama.cpp / ours ([\d.]+)x", out)
    assert m, out
    assert float(m.group(1)) > 0 and 30.0 < float(m.group(2)) < 50.0, out   # 40 ms a prefill, not 40 + 60/3
