"""`nanochat-tui bench --gpu-peer`'s llama.cpp side on any machine: the CUDA flags reach llama-bench,
both prompt sizes and both decode depths are picked out of its JSON, and ours / llama.cpp is
each test's ratio in the table. The measuring itself needs CUDA (the H200 run in docs/benchmarks.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chatapp.bench.args import parse
from chatapp.bench.gpu import compare, print_gpu_peer
from chatapp.bench.llamacpp import run_peer
from model.errors import UserError

DATA = Path(__file__).parent / "data" / "llama_bench"


def llama_bench_json(tmp_path: Path, tests: list[tuple[int, int, int, float]]) -> Path:
    """llama-bench's real JSON record, one per (n_prompt, n_gen, n_depth, avg_ts)."""
    base = json.loads((DATA / "pp32_tg8_d0.json").read_text())[0]
    out = [dict(base, n_prompt=p, n_gen=g, n_depth=d, avg_ts=ts, backends="CUDA") for p, g, d, ts in tests]
    path = tmp_path / f"out{len(list(tmp_path.iterdir()))}.json"
    path.write_text(json.dumps(out))
    return path


def test_gpu_peer_runs_llama_bench_with_cuda_flags_and_takes_ratios(tmp_path, capsys):
    d0 = llama_bench_json(tmp_path, [(512, 0, 0, 70000.0), (8192, 0, 0, 50000.0), (0, 64, 0, 900.0)])
    deep = llama_bench_json(tmp_path, [(0, 64, 8192, 800.0)])
    fake = tmp_path / "llama-bench"
    # Only the right flags get output: a run without -ngl 99 -fa 1 fails the peer.
    fake.write_text(f'#!/bin/sh\ncase "$*" in *"-ngl 99 -fa 1 -p 512,8192 -n 64 -d 0"*) cat {d0} ;; '
                    f'*"-ngl 99 -fa 1 -p 0 -n 64 -d 8192"*) cat {deep} ;; *) exit 3 ;; esac\n')
    fake.chmod(0o755)
    peer = run_peer(str(fake), "m.gguf", 16, "512,8192", 64, 8192, 2, extra=["-ngl", "99", "-fa", "1"])
    assert "skipped" not in peer, peer
    ours = {"prefill": {"pp512": {"tok_s": 210000.0}, "pp8192": {"tok_s": 400000.0}},
            "eager512": {"pp512": {"tok_s": 25000.0}, "pp8192": {"tok_s": 25000.0}},
            "decode": {"0": 2500.0, "deep": 2000.0, "deep_at": 8126}, "engine": "fused", "prefill_engine": "graphs",
            "backend": "fa3", "turn": {"turn": 100, "history": 4000, "ttft_ms": 3.2},
            "memory": {"peak_bytes": 5e8, "peak_allocated_bytes": 4e8, "bound_bytes": 8e8}}
    res = compare(ours, peer, 64, 2, "m.gguf")
    assert res["ratios"] == pytest.approx({"pp512": 3.0, "pp8192": 8.0, "tg_d0": 2500 / 900, "tg_d8192": 2.5})
    print_gpu_peer("SmolLM2 shape", "", res)
    out = capsys.readouterr().out
    assert "3.00x" in out and "8.00x" in out and "3.20 ms" in out and ": met" in out


def test_gpu_peer_needs_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(UserError, match="CUDA"):
        parse(["--gpu-peer"])
