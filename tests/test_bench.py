"""`nanochat-tui bench` on a tiny model: it runs, the table comes first and the JSON line last."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import greedy

from chatapp.bench.main import main
from chatapp.bench.peer import hf_static_decode
from model.decode.generate import Generator


def test_bench_prints_table_then_one_json_line(capsys):
    assert main(["--quick", "--models", "random:tiny", "--turns", "4", "--no-peer"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert any("multi-turn" in line for line in lines[:-1])
    doc = json.loads(lines[-1])
    (res,) = doc["models"]
    assert doc["peak_bandwidth_gbs"] > 0
    mt = res["multiturn"]
    assert len(mt["persistent"]) == len(mt["reprefill"]) == 4
    for row in mt["persistent"] + mt["reprefill"]:
        assert set(row) >= {"turn", "history", "prefill_tokens", "ttft_ms", "decode_tok_s"}
        assert row["ttft_ms"] > 0
    # The persistent run prefills only the new tokens; the baseline the whole chat every turn.
    last_ours, last_base = mt["persistent"][-1], mt["reprefill"][-1]
    assert last_ours["prefill_tokens"] < last_base["prefill_tokens"] == last_ours["history"] + last_ours[
        "prefill_tokens"]
    assert mt["last_ttft_vs_first"] > 0 and mt["last_speedup_vs_reprefill"] > 0
    assert mt["same_replies"] == 4  # greedy: both ways of building the cache give the same replies
    assert [r["context"] for r in res["decode"]] == [64, 256]
    for row in res["decode"]:
        assert row["tpot_ms"] > 0 and row["tok_s"] > 0 and 0 < row["mbu"] < 1
        assert row["bytes_per_token"] > res["weight_bytes_per_token"]  # weights plus the KV read


def test_peer_runs_our_weights(tiny):
    """The transformers twin decodes the same greedy tokens: the peer really runs our model."""
    prompt = list(range(20, 50))
    peer = hf_static_decode(tiny.model, prompt, 8)
    gen = Generator(tiny.model, tiny.model.new_cache(128), tiny.model.config.vocab_size)  # HF argmaxes all ids
    ours = greedy(gen, prompt, 8)
    assert peer["first_tokens"] == ours
    assert peer["tok_s"] > 0


@pytest.mark.parametrize("args, error", [
    (["--contexts", "abc"], "argument --contexts: expected a whole number >= 1, got 'abc'"),
    (["--turns", "0"], "argument --turns: expected a whole number >= 1, got '0'"),
    (["--decode-tokens", "-3"], "argument --decode-tokens: expected a whole number >= 1, got '-3'"),
    (["--models", "random:tiny,,"], "argument --models: an empty model spec in 'random:tiny,,'"),
    (["--device", "foo"], "--device 'foo' is not a device"),
    (["--turns", "100000"], "100000 turns of 4-token replies need"),
], ids=["contexts", "turns", "decode-tokens", "models", "device", "too-many-turns"])
def test_bad_arguments_are_one_line_errors(args, error):
    p = subprocess.run([sys.executable, "-m", "chatapp.cli", "bench", "--quick", "--no-peer", "--models",
                        "random:tiny", *args], capture_output=True, text=True, timeout=120)
    assert p.returncode in (1, 2) and "Traceback" not in p.stderr
    assert error in p.stderr.strip().splitlines()[-1], p.stderr
