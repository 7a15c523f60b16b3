"""The prefill CPU-time bench (chatapp/bench/prefill_cputime.py) on the tiny llama-quantize file:
ours from the app's real prefill, llama.cpp's from two runs' child CPU time (-r 4 and -r 1),
whose difference cancels its loading."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from chatapp.bench import prefill_cputime
from model.cpu import native

TINY = Path(__file__).parent / "data" / "tiny_llama_q3_k_m.gguf"
pytestmark = pytest.mark.skipif(native.library() is None, reason=f"CPU kernels unavailable: {native.why_not()}")


def rep_burning_llama_bench(tmp_path: Path, ms_per_rep: float) -> str:
    """A stand-in llama-bench spending `ms_per_rep` of CPU a repetition plus a fixed 30 ms."""
    script = tmp_path / "llama-bench"
    script.write_text(f"""#!{sys.executable}
import sys, time
r = int(sys.argv[sys.argv.index("-r") + 1])
end = time.process_time() + 0.030 + r * {ms_per_rep} / 1000
while time.process_time() < end:
    pass
print("[]")
""")
    script.chmod(0o755)
    return str(script)


def test_prefill_cputime_times_ours_and_cancels_llamas_fixed_part(tmp_path, capsys):
    prefill_cputime.main([str(TINY), "--pp", "24", "--rounds", "1",
                          "--llama-bench", rep_burning_llama_bench(tmp_path, 40.0)])
    out = capsys.readouterr().out
    m = re.search(r"ours ([\d.]+) ms .* llama.cpp ([\d.]+) ms .* llama.cpp / ours ([\d.]+)x", out)
    assert m, out
    assert float(m.group(1)) > 0 and 30.0 < float(m.group(2)) < 50.0, out   # 40 ms a prefill, not 40 + 30/3
