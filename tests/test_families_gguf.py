"""The tiny Llama 3.x, Qwen2 and Qwen3 models of test_families_hf.py, written as GGUF files the way
llama.cpp's convert_hf_to_gguf.py writes them, load and give transformers' logits.

The tensor names come from the gguf package's own tensor map, the metadata from GGUFWriter's
own key helpers; Q/K rows are permuted for `llama` only and Llama 3.x scaling is a rope_freqs
tensor, both as the converter does.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter, quants
from helpers import VARIANTS, save_variant, tiny_tokenizer

from model.errors import ModelLoadError
from model.loading import load_model

ARCH = {"llama3-untied": gguf.MODEL_ARCH.LLAMA, "qwen2-tied": gguf.MODEL_ARCH.QWEN2,
        "qwen3-untied": gguf.MODEL_ARCH.QWEN3}


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: each head's two rotary halves interleaved."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_freqs(theta: float, dim: int, s: dict) -> np.ndarray:
    """What the converter stores as rope_freqs for rope_type llama3: a divisor per frequency."""
    out = []
    for freq in 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim):
        wavelen = 2 * math.pi / freq
        orig, lo, hi = s["original_max_position_embeddings"], s["low_freq_factor"], s["high_freq_factor"]
        smooth = (orig / wavelen - lo) / (hi - lo)
        out.append(1 if wavelen < orig / hi else s["factor"] if wavelen > orig / lo
                   else 1 / ((1 - smooth) / s["factor"] + smooth))
    return np.array(out, dtype=np.float32)


def add_metadata(w: GGUFWriter, cfg, head_dim: int, meta: dict) -> None:
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if "head_dim" in cfg.to_dict():   # the converter writes key/value lengths when config.json has head_dim
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if w.arch == "llama":
        w.add_rope_dimension_count(head_dim)
    for key, value in meta.items():
        {int: w.add_uint32, str: w.add_string}[type(value)](key.format(arch=w.arch), value)


def add_vocab(w: GGUFWriter, template: str, eos: str) -> None:
    model = json.loads(tiny_tokenizer().to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    # <|...|> markers are CONTROL (3); Qwen3's <think> tags USER_DEFINED (4), as the converter writes them
    w.add_token_types([3 if t.startswith("<|") else 4 if t in ("<think>", "</think>") else 1 for t in tokens])
    w.add_token_merges([" ".join(m) for m in model["merges"]])
    w.add_eos_token_id(model["vocab"][eos])
    w.add_bos_token_id(model["vocab"]["<|begin_of_text|>"])
    w.add_chat_template(template)


def write_gguf(path: Path, name: str, hf, quant: Q | None = None, meta: dict | None = None) -> dict:
    """`hf`'s weights as llama.cpp names them; returns the state dict they stand for (quantized
    matrices as they dequantize)."""
    cfg, (_, _, template, eos) = hf.config, VARIANTS[name]
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w = GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[ARCH[name]])
    add_metadata(w, cfg, head_dim, meta or {})
    add_vocab(w, template, eos)
    names = gguf.get_tensor_name_map(ARCH[name], cfg.num_hidden_layers)
    state = {}
    for key, t in hf.state_dict().items():
        if key == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        data = t.numpy().astype(np.float32)
        kind = quant if quant is not None and data.ndim == 2 and ".mlp." in key else Q.F32
        if kind != Q.F32:
            data = quants.quantize(data, kind)
        state[key] = torch.from_numpy(quants.dequantize(data, kind).reshape(t.shape).astype(np.float32))
        if w.arch == "llama" and key.endswith(("q_proj.weight", "k_proj.weight")):
            data = permute(data, cfg.num_attention_heads if "q_proj" in key else cfg.num_key_value_heads)
        w.add_tensor(names.get_name(key, try_suffixes=(".weight", ".bias")), data,
                     raw_dtype=None if kind == Q.F32 else kind)
    if cfg.rope_parameters.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_freqs(cfg.rope_parameters["rope_theta"], head_dim,
                                                            cfg.rope_parameters))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return state


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("NANOCHAT_TUI_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("quant", [None, Q.Q8_0], ids=["f32", "q8_0-mlp"])
def test_gguf_logits_equal_transformers(tmp_path, name, quant):
    hf = save_variant(tmp_path / "hf", name)
    state = write_gguf(tmp_path / f"{name}.gguf", name, hf, quant)
    hf.load_state_dict(state, strict=not hf.config.tie_word_embeddings)
    lm = load_model(str(tmp_path / f"{name}.gguf"))
    t = lm.template
    first = t.start("Be brief.") + t.user_turn("hello there")
    second = [5, 77, 120, *t.end_reply(), *t.user_turn("the capital of France? 12")]
    cache = lm.model.new_cache(256)
    with torch.no_grad():
        got = torch.cat([lm.model(torch.tensor([first]), cache)[0], lm.model(torch.tensor([second]), cache)[0]])
        ref = hf(torch.tensor([first + second])).logits[0]
    assert (got - ref).abs().max().item() <= 1e-4
    assert lm.model.config.tie_word_embeddings == hf.config.tie_word_embeddings


@pytest.mark.parametrize("name, meta, error", [
    ("qwen2-tied", {"{arch}.rope.scaling.type": "yarn"}, "qwen2.rope.scaling.type 'yarn' is not supported"),
    ("qwen3-untied", {"{arch}.expert_count": 8}, "qwen3.expert_count 8: mixture-of-experts"),
    ("qwen2-tied", {"{arch}.attention.sliding_window": 64}, "qwen2.attention.sliding_window 64: sliding-window"),
], ids=["yarn", "experts", "sliding"])
def test_gguf_refusals_name_the_key(tmp_path, name, meta, error):
    hf = save_variant(tmp_path / "hf", name)
    write_gguf(tmp_path / "bad.gguf", name, hf, meta=meta)
    with pytest.raises(ModelLoadError) as e:
        load_model(str(tmp_path / "bad.gguf"))
    assert str(e.value).startswith(f"{tmp_path / 'bad.gguf'}: ") and error in str(e.value)
    assert "\n" not in str(e.value)
