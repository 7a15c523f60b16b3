"""A Hugging Face Llama directory (save_pretrained + a byte-level BPE tokenizer.json) loads
directly, matches transformers' logits, and chats."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import corpus, train

from chatapp.chat.events import TurnStats
from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from model.errors import ModelLoadError
from model.loading import load_model

transformers = pytest.importorskip("transformers")
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf-llama")
    tok = train("smollm", corpus()[:300], vocab_size=600)
    (d / "tokenizer.json").write_text(tok.to_str(), encoding="utf-8")
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": CHATML, "eos_token": "<|endoftext|>", "bos_token": None}))
    cfg = transformers.LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=256, tie_word_embeddings=True)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    hf.save_pretrained(d, safe_serialization=True)
    return d, hf, tok


def test_loads_and_matches_transformers(hf_dir):
    d, hf, ref_tok = hf_dir
    lm = load_model(str(d))
    text = "Hello world, 12345 and more text!"
    ids = lm.tokenizer.encode(text)
    assert ids == ref_tok.encode(text).ids
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits
        got = lm.model(torch.tensor([ids]), lm.model.new_cache(64))
    assert (got - ref).abs().max().item() <= 1e-4
    assert lm.template.stop_ids == {lm.tokenizer.token("<|im_end|>"), lm.tokenizer.token("<|endoftext|>")}


def test_chats_two_turns(hf_dir):
    lm = load_model(str(hf_dir[0]))
    s = Session(lm, Settings(temperature=0.0, max_new_tokens=6), context=200)
    t1 = [e for e in s.send("hi there") if isinstance(e, TurnStats)][0]
    t2 = [e for e in s.send("and again") if isinstance(e, TurnStats)][0]
    assert t2.cached_before == t1.cache_seqlens and t2.prefill_tokens < t1.prefill_tokens + 10


def test_unsupported_configs_are_one_line_errors(hf_dir, tmp_path):
    d = hf_dir[0]
    for name in ("tokenizer.json", "tokenizer_config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((d / name).read_bytes())
    cfg = json.loads((d / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}))
    with pytest.raises(ModelLoadError, match="rope_scaling.rope_type 'dynamic' is not supported"):
        load_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ModelLoadError, match="unsupported architecture GPT2LMHeadModel"):
        load_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "hidden_size": 32}))
    with pytest.raises(ModelLoadError, match="has shape"):
        load_model(str(tmp_path))
    (tmp_path / "model.safetensors").write_bytes(b"not safetensors")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="unreadable safetensors"):
        load_model(str(tmp_path))


@pytest.mark.parametrize("file, edit, error", [
    ("config.json", lambda c: [1], "config.json: expected a JSON object, found list"),
    ("config.json", lambda c: {**c, "hidden_size": "64"}, "config.json: hidden_size must be a whole number >= 1"),
    ("config.json", lambda c: {**c, "num_hidden_layers": 2.0}, "num_hidden_layers must be a whole number >= 1"),
    ("config.json", lambda c: {**c, "max_position_embeddings": -5}, "max_position_embeddings must be a whole"),
    ("config.json", lambda c: {**c, "rms_norm_eps": "x"}, "rms_norm_eps must be a positive number, not 'x'"),
    ("config.json", lambda c: {**c, "rope_theta": 0}, "rope_theta must be a positive number, not 0"),
    ("config.json", lambda c: {**c, "num_attention_heads": 3}, "heads must group evenly"),
    ("config.json", lambda c: {**c, "num_hidden_layers": 1}, "weights the config does not use, e.g. model.layers.1"),
    ("tokenizer.json", lambda c: [], "malformed tokenizer.json or tokenizer_config.json"),
    ("tokenizer_config.json", lambda c: [1], "tokenizer_config.json: expected a JSON object, found list"),
    ("tokenizer_config.json", lambda c: {**c, "chat_template": 5}, "chat_template and nanochat_tui_default_system"),
], ids=["not-object", "text-width", "float-layers", "negative-context", "text-eps", "zero-rope", "odd-heads",
        "too-few-layers", "tokenizer-list", "tokenizer-config-list", "template-number"])
def test_malformed_files_are_one_line_errors(hf_dir, tmp_path, file, edit, error):
    d = hf_dir[0]
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((d / name).read_bytes())
    (tmp_path / file).write_text(json.dumps(edit(json.loads((d / file).read_text()))))
    with pytest.raises(ModelLoadError) as e:
        load_model(str(tmp_path))
    assert error in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_architectures_as_one_string_loads(hf_dir, tmp_path):
    d = hf_dir[0]
    for name in ("tokenizer.json", "tokenizer_config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((d / name).read_bytes())
    cfg = json.loads((d / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "architectures": "LlamaForCausalLM"}))
    assert load_model(str(tmp_path)).model.config.num_hidden_layers == 2
