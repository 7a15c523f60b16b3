"""`nanochat-tui bench --cpu-peer`: llama-bench's JSON parsed from real output, the peer runner,
the bytes a token reads, and a whole run without a peer on a tiny model (seconds, no timings)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch

from chatapp.bench.decode import weight_bytes_per_token
from chatapp.bench.llamacpp import ENV, find_binary, parse_tests, pick, run_peer
from chatapp.bench.main import main

DATA = Path(__file__).parent / "data" / "llama_bench"


def test_parses_real_llama_bench_json():
    """Two real outputs of llama-bench -o json (SmolLM2 Q4_1, 2 threads, -r 2): pp32 and tg8 from
    depth 0, then tg8 at depth 64 (-p 0)."""
    rows = parse_tests((DATA / "pp32_tg8_d0.json").read_text()) + parse_tests((DATA / "tg8_d64.json").read_text())
    assert [(r["test"], r["kind"], r["tokens"], r["depth"]) for r in rows] == [
        ("pp32", "pp", 32, 0), ("tg8", "tg", 8, 0), ("tg8", "tg", 8, 64)]
    raw = json.loads((DATA / "pp32_tg8_d0.json").read_text())
    assert rows[0]["tok_s"] == raw[0]["avg_ts"] and rows[0]["stddev_tok_s"] == raw[0]["stddev_ts"]
    assert all(r["threads"] == 2 and r["reps"] == 2 and r["tok_s"] > 0 for r in rows)
    assert rows[0]["model_type"] == "llama 256M Q4_1"
    assert pick(rows, "tg", 8, 64) is rows[2] and pick(rows, "tg", 8, 1500) is None


def test_parser_skips_a_preamble_and_refuses_no_array():
    text = (DATA / "tg8_d64.json").read_text()
    assert parse_tests("build: 1 (abc)\n" + text)[0]["depth"] == 64
    with pytest.raises(ValueError):
        parse_tests("error: failed to load model\n")


def test_find_binary(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV, raising=False)
    assert find_binary(None)[0] is None and "--llama-bench" in find_binary(None)[1]
    not_exec = tmp_path / "llama-bench"
    not_exec.write_text("")
    assert find_binary(str(not_exec)) == (None, f"{not_exec} is not an executable file")
    not_exec.chmod(not_exec.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv(ENV, str(not_exec))
    assert find_binary(None) == (str(not_exec), "")


def fake_llama_bench(tmp_path: Path, body: str) -> str:
    script = tmp_path / "llama-bench"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return str(script)


def test_run_peer_joins_both_invocations(tmp_path):
    """A stand-in that prints the real samples: -d 0 gets pp+tg, the other call tg at depth."""
    fake = fake_llama_bench(tmp_path, f'case "$*" in *"-d 0"*) cat {DATA}/pp32_tg8_d0.json ;; '
                                      f'*) cat {DATA}/tg8_d64.json ;; esac\n')
    res = run_peer(fake, "model.gguf", 2, 32, 8, 64, 2)
    assert [(t["kind"], t["depth"]) for t in res["tests"]] == [("pp", 0), ("tg", 0), ("tg", 64)]
    assert res["commands"][0].endswith("-p 32 -n 8 -d 0") and res["commands"][1].endswith("-p 0 -n 8 -d 64")
    assert "-t 2" in res["commands"][0] and "-m model.gguf" in res["commands"][0]
    assert res["peak_rss_bytes"] is None or res["peak_rss_bytes"] > 0


def test_a_failing_peer_is_skipped_with_its_last_line(tmp_path):
    fake = fake_llama_bench(tmp_path, 'echo "loading" >&2; echo "error: failed to load model" >&2; exit 1\n')
    res = run_peer(fake, "model.gguf", 2, 32, 8, 64, 2)
    assert res["skipped"] == "llama-bench failed: error: failed to load model"


class PackedLinear(torch.nn.Module):
    """What a quantized linear looks like to the bench: int8 codes and fp32 scales as buffers."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.in_features, self.out_features = n_in, n_out
        self.register_buffer("codes", torch.zeros(n_out, n_in, dtype=torch.int8))
        self.register_buffer("scales", torch.ones(n_out))


def test_weight_bytes_count_buffers_of_quantized_linears_and_tied_heads_once():
    model = torch.nn.Module()
    model.embed = torch.nn.Embedding(100, 16)
    model.q = PackedLinear(16, 32)
    model.o = torch.nn.Linear(32, 16, bias=True)
    model.head = torch.nn.Linear(16, 100, bias=False)
    model.head.weight = model.embed.weight  # tied: counted once, as the head
    model.head2 = torch.nn.Linear(16, 100, bias=False)
    model.head2.weight = model.embed.weight
    assert weight_bytes_per_token(model) == (32 * 16 + 32 * 4) + (32 * 16 * 4 + 16 * 4) + 100 * 16 * 4


def test_cpu_peer_bench_without_a_peer_still_ends_in_json(capsys, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert main(["--cpu-peer", "--device", "cpu", "--models", "random:tiny", "--pp", "16", "--tg", "4",
                 "--depth", "32", "--peer-reps", "1", "--threads", "1"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith("peer skipped: no llama-bench given") for line in out[:-1])
    assert any(line.startswith("metric") for line in out[:-1])
    doc = json.loads(out[-1])
    (res,) = doc["models"]
    cp = res["cpu_peer"]
    assert cp["threads"] == 1 and cp["depth"] == 32 and cp["pp"] == 16 and cp["tg"] == 4
    assert cp["llama_cpp"]["skipped"].startswith("no llama-bench given")
    assert cp["ratios"] == {"decode_short": None, "decode_deep": None, "prefill": None}
    for key in ("decode_short", "decode_deep", "prefill"):
        assert cp["ours"][key]["tok_s"] > 0 and len(cp["ours"][key]["samples_tok_s"]) == 1
    assert cp["ours"]["decode_deep"]["bytes_per_token"] > cp["ours"]["decode_short"]["bytes_per_token"]
    assert cp["read_bandwidth_gbs"] > 0 and cp["ours"]["decode_short"]["ceiling_tok_s"] > 0
    hl = cp["headless"]
    assert "skipped" not in hl, hl
    assert hl["ready_s"] > 0 and hl["context"] == 2048 and hl["rss_after_turn_bytes"] > 0
    assert hl["peak_rss_bytes"] >= hl["rss_after_turn_bytes"]
    assert cp["disk"]["ours_bytes"] is None and cp["disk"]["gguf_bytes"] is None
    assert cp["targets"]["prefill"] == {"target": ">= 3.0", "value": None, "met": None}
    # not the default model: issue 24's 1.3x for both decodes, its RSS printed but not judged
    assert cp["default_model"] is False
    assert cp["targets"]["decode_short"]["target"] == cp["targets"]["decode_deep"]["target"] == ">= 1.3"
    assert cp["targets"]["rss_mb"] == {"target": None, "value": hl["rss_after_turn_bytes"] / 1e6, "met": None}
    short = cp["ours"]["decode_short"]
    assert cp["targets"]["ceiling"]["value"] == short["tok_s"] / short["ceiling_tok_s"]
    rows = {line.split("|")[0].strip(): line.split("|")[-1].strip() for line in out if "|" in line}
    assert rows["decode tok/s, tg4 from 8 (llama.cpp: 0)"] == rows["decode tok/s, tg4 at depth 32"] == ">= 1.3x"
    assert rows["prefill tok/s, pp16"] == ">= 3x" and rows["size on disk (ours: what we write; llama.cpp: the GGUF)"] \
        == "<= 1.05x"
    assert any(line.startswith("memory read rate") and line.endswith("(target >= 80%: " +
               ("met" if cp["targets"]["ceiling"]["met"] else "missed") + " short)") for line in out)


def test_busy_bench_runs_under_its_own_hog_and_ends_in_json(capsys, monkeypatch):
    import psutil

    monkeypatch.delenv(ENV, raising=False)
    seen = []
    from chatapp.bench import busy

    real = busy.ours_with

    def spy(*a, **k):   # which runs had a `yes` child alive
        seen.append(any(p.name() == "yes" for p in psutil.Process().children()))
        return real(*a, **k)

    monkeypatch.setattr(busy, "ours_with", spy)
    assert main(["--cpu-peer", "--busy", "--device", "cpu", "--models", "random:tiny", "--pp", "16", "--tg", "4",
                 "--peer-reps", "1", "--threads", "2"]) == 0
    assert seen == [False, True, True, False]   # quiet 1 thread, busy default and 1 thread, quiet again
    assert not any(p.name() == "yes" for p in psutil.Process().children())   # the hog is gone
    out = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith("ours, busy, 2 threads (default)") for line in out)
    res = json.loads(out[-1])["models"][0]["cpu_busy"]
    assert res["busy_default"]["threads"] == 2 and res["busy_1t"]["threads"] == 1
    assert res["busy_default"]["decode"]["tok_s"] > 0 and res["quiet_1t"]["prefill"]["tok_s"] > 0
    assert len(res["quiet_1t"]["decode"]["samples_tok_s"]) == 2   # one rep before the hog, one after
    assert res["llama_cpp_busy"] == {"skipped": "no llama-bench"}
    assert res["targets"]["decode_vs_llama_cpp"]["met"] is None
    assert res["targets"]["decode_vs_quiet_1t"]["value"] > 0


def test_llama_cpp_runs_without_our_openmp_wait_policy(monkeypatch):
    """We set OMP_WAIT_POLICY=PASSIVE for our own threads; llama-bench (OpenMP too) must not
    inherit it, or the bench times a llama.cpp its users never run. A user's own setting stays."""
    import model
    from chatapp.bench.llamacpp import peer_env

    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setattr(model, "OMP_WAIT_POLICY_DEFAULTED", True)
    assert "OMP_WAIT_POLICY" not in peer_env() and peer_env()["PATH"] == os.environ["PATH"]
    monkeypatch.setattr(model, "OMP_WAIT_POLICY_DEFAULTED", False)
    assert peer_env()["OMP_WAIT_POLICY"] == "PASSIVE"


def test_the_default_model_is_judged_on_issue_24s_targets(capsys):
    """SmolLM2-135M (by its GGUF's or pulled folder's name): 1.5x from empty, 2x at depth, RSS <=
    392 MB; each target met or missed on its own value, the ceiling as our share of it."""
    from chatapp.bench.cpu import is_default_model, print_cpu_peer, targets

    assert is_default_model("/m/SmolLM2-135M-Instruct.Q4_1.gguf") and is_default_model("SmolLM2-135M-Instruct")
    assert not is_default_model("gemma3-270m-q4_k_m") and not is_default_model("random:tiny")
    rate = {"tok_s": 100.0, "stddev_tok_s": 1.0}
    res = {"default_model": True, "ratios": {"decode_short": 1.6, "decode_deep": 1.96, "prefill": 3.1},
           "ours": {"decode_short": {**rate, "ceiling_tok_s": 130.0}, "decode_deep": {**rate, "ceiling_tok_s": 120.0},
                    "prefill": rate, "weight_bytes_per_token": 96e6, "kv_bytes_per_token": 23040,
                    "engine": "c-step", "backend": "qdecode.c"},
           "headless": {"rss_after_turn_bytes": 393e6}, "disk": {"ratio": 1.0005, "ours_bytes": 1, "gguf_bytes": 1},
           "threads": 2, "reps": 1, "tg": 64, "pp": 512, "depth": 1500, "read_bandwidth_gbs": 25.0,
           "llama_cpp": {"skipped": "test"}}
    res["targets"] = t = targets(res)
    assert {k: (v["target"], v["met"]) for k, v in t.items()} == {
        "decode_short": (">= 1.5", True), "decode_deep": (">= 2.0", False), "prefill": (">= 3.0", True),
        "ceiling": (">= 0.8", False), "rss_mb": ("<= 392.0", False), "disk_ratio": ("<= 1.05", True)}
    assert t["ceiling"]["value"] == 100.0 / 130.0
    print_cpu_peer("SmolLM2-135M-Instruct.Q4_1", "", res)
    out = capsys.readouterr().out
    for text in (">= 1.5x: met", ">= 2x: missed", ">= 3x: met", "<= 392 MB: missed", "<= 1.05x: met",
                 "(target >= 80%: missed short)"):
        assert text in out
