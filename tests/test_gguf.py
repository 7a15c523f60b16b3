"""GGUF loading: tiny Llama GGUFs written here with gguf.GGUFWriter, the way llama.cpp's converter
writes them (Q/K rows permuted, block-quantized), loaded by us and compared with transformers'
LlamaForCausalLM holding the same (dequantized, un-permuted) weights."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from gguf import GGMLQuantizationType as Q
from helpers import FFN, HEADS, HIDDEN, KV_HEADS, LAYERS, MIXED, SYSTEM, llama_cpp_permute, write_gguf

from model.errors import ModelLoadError
from model.loading import LoadOptions, load_model


def hf_model(state: dict, tied: bool) -> transformers.LlamaForCausalLM:
    cfg = transformers.LlamaConfig(
        vocab_size=state["model.embed_tokens.weight"].shape[0], hidden_size=HIDDEN, intermediate_size=FFN,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, rms_norm_eps=1e-5,
        rope_theta=10000.0, max_position_embeddings=128, tie_word_embeddings=tied)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=not tied)
    return model


def our_logits(lm, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return lm.model(torch.tensor([ids]), lm.model.new_cache(64))[0]


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("NANOCHAT_TUI_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.mark.parametrize("types, tied", [({}, True), (MIXED, False)], ids=["f32-tied", "all-types-untied"])
def test_logits_match_transformers(tmp_path, home, types, tied):
    path = tmp_path / "tiny.gguf"
    state = write_gguf(path, types, tied)
    lm = load_model(str(path))
    ids = lm.template.start(lm.template.default_system) + lm.template.user_turn("hello 1234 world")
    with torch.no_grad():
        ref = hf_model(state, tied)(torch.tensor([ids])).logits[0]
    assert (our_logits(lm, ids) - ref).abs().max().item() <= 1e-4
    assert lm.template.default_system == SYSTEM
    assert lm.tokenizer.vocab_size == state["model.embed_tokens.weight"].shape[0]
    # The check has teeth: transformers with Q/K rows as stored in the GGUF is far off.
    permuted = dict(state)
    for i in range(LAYERS):
        for proj, heads in (("q_proj", HEADS), ("k_proj", KV_HEADS)):
            key = f"model.layers.{i}.self_attn.{proj}.weight"
            permuted[key] = llama_cpp_permute(state[key], heads)
    with torch.no_grad():
        wrong = hf_model(permuted, tied)(torch.tensor([ids])).logits[0]
    assert (wrong - ref).abs().max().item() > 1e-2


def files_under(*roots: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for r in roots if r.exists() for p in r.rglob("*") if p.is_file()}


def test_opening_a_gguf_writes_only_its_small_files(tmp_path, home):
    """No model-sized file: not beside the GGUF, not in the cache. Only config.json and the
    tokenizer's files are cached, once."""
    folder = tmp_path / "models"
    folder.mkdir()
    path = folder / "tiny.gguf"
    write_gguf(path, MIXED, tied=False)
    before = files_under(folder, home)
    lm = load_model(str(path), LoadOptions(quantized=True))
    written = {p: t for p, t in files_under(folder, home).items() if p not in before}
    assert sorted(p.name for p in written) == ["config.json", "tokenizer.json", "tokenizer_config.json"]
    assert all(p.parent.parent == home / "gguf-meta" for p in written)
    assert sum(p.stat().st_size for p in written) < path.stat().st_size
    assert sum(p.stat().st_size for p in written if p.name != "tokenizer.json") < 10_000
    load_model(str(path), LoadOptions(quantized=True))
    assert files_under(folder, home) == {**before, **written}   # the second open reads them, writes nothing
    assert lm.model.lm_head.out_features > 0


def leftovers(home: Path) -> list[Path]:
    return [p for p in home.rglob("*")] if home.exists() else []


@pytest.mark.parametrize("keep", [0.0, 0.003, 0.5, 0.98])
def test_truncated_file(tmp_path, home, keep):
    path = tmp_path / "cut.gguf"
    write_gguf(path, MIXED, tied=False)
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])
    with pytest.raises(ModelLoadError) as e:
        load_model(str(path))
    assert "truncated" in str(e.value) and "\n" not in str(e.value)
    assert leftovers(home) == []


def test_unsupported_architecture(tmp_path, home):
    path = tmp_path / "gpt2.gguf"
    write_gguf(path, {}, tied=True, arch="gpt2")
    with pytest.raises(ModelLoadError, match="architecture 'gpt2' is not supported"):
        load_model(str(path))
    assert leftovers(home) == []


def test_unsupported_quant_type(tmp_path, home):
    """Q8_K (llama.cpp's intermediate type, never a weight's) is one the gguf package cannot read."""
    path = tmp_path / "q8k.gguf"
    write_gguf(path, {0: {"ffn_up": Q.Q8_K}}, tied=True)
    with pytest.raises(ModelLoadError, match=r"tensor blk.0.ffn_up.weight has type Q8_K, which nanochat-tui "
                                             r"cannot read; supported types: F32, F16, BF16, Q8_0.*Q5_K and the "
                                             r"other types the gguf package dequantizes") as e:
        load_model(str(path))
    assert "\n" not in str(e.value) and leftovers(home) == []


@pytest.mark.parametrize("meta, error", [
    ({"attention.head_count": 0}, "llama.embedding_length 256 and llama.attention.head_count 0 do not make a model"),
    ({"embedding_length": "wide"}, "'llama.embedding_length' should be a whole number, not 'wide'"),
    ({"attention.layer_norm_rms_epsilon": "x"}, "'llama.attention.layer_norm_rms_epsilon' should be a number, not 'x'"),
    ({"rope.freq_base": 0.0}, "rope_theta must be a positive number, not 0.0"),
    ({"block_count": 0}, "num_hidden_layers must be a whole number >= 1, not 0"),
    ({"block_count": LAYERS + 1}, f"missing weights, e.g. model.layers.{LAYERS}."),
], ids=["no-heads", "text-width", "text-eps", "zero-rope", "no-layers", "missing-layer"])
def test_malformed_metadata_names_the_gguf(tmp_path, home, meta, error):
    path = tmp_path / "bad.gguf"
    write_gguf(path, {}, tied=True, meta=meta)
    with pytest.raises(ModelLoadError) as e:
        load_model(str(path))
    assert str(e.value).startswith(f"{path}: ") and error in str(e.value) and "\n" not in str(e.value)
    assert leftovers(home) == []


def test_cli_reports_a_bad_gguf_in_one_line(tmp_path):
    path = tmp_path / "cut.gguf"
    write_gguf(path, {}, tied=True)
    path.write_bytes(path.read_bytes()[:5000])
    home = tmp_path / "home"
    r = subprocess.run([sys.executable, "-m", "chatapp.cli", "--headless", "--model", str(path)], input="hi\n",
                       capture_output=True, text=True, timeout=120,
                       env={"NANOCHAT_TUI_HOME": str(home), "PATH": "/usr/bin:/bin"})
    assert r.returncode != 0 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "truncated" in r.stderr and "Traceback" not in r.stderr
    assert leftovers(home) == []
