"""GGUF loading: tiny Llama GGUFs written here with gguf.GGUFWriter, the way llama.cpp's converter
writes them (Q/K rows permuted, block-quantized), loaded by us and compared with transformers'
LlamaForCausalLM holding the same (dequantized, un-permuted) weights."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from gguf import GGML_QUANT_SIZES, GGUFWriter, quants
from gguf import GGMLQuantizationType as Q
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from model.errors import ModelLoadError
from model.loading import load_model

HIDDEN, FFN, HEADS, KV_HEADS, LAYERS = 256, 512, 4, 2, 2   # K-quants need rows of 256
SYSTEM = "You are a tiny test model."
TEMPLATE = ("{% for m in messages %}{% if loop.first and m['role'] != 'system' %}{{ '<|im_start|>system\n"
            + SYSTEM + "<|im_end|>\n' }}{% endif %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + "
            "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
HF_LAYER = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
            "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
            "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
# Every supported type appears; the Q/K projections go through four different ones.
MIXED = {"token_embd": Q.Q8_0, "output": Q.Q2_K,
         0: {"attn_q": Q.Q4_0, "attn_k": Q.Q4_1, "attn_v": Q.F16, "attn_output": Q.BF16,
             "ffn_gate": Q.Q4_K, "ffn_up": Q.Q5_K, "ffn_down": Q.Q5_0},
         1: {"attn_q": Q.Q8_0, "attn_k": Q.F32, "attn_v": Q.Q5_1, "attn_output": Q.Q6_K,
             "ffn_gate": Q.Q3_K, "ffn_up": Q.IQ4_XS, "ffn_down": Q.IQ4_NL}}
# Block types gguf cannot quantize (random blocks instead): where their fp16 scale(s) sit.
K_BLOCKS = {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.Q2_K: (80, 82), Q.Q3_K: (108,),
            Q.IQ4_XS: (0,), Q.IQ4_NL: (0,), Q.IQ2_XXS: (0,), Q.Q8_K: ()}


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's HF converter does to Q/K rows: each head's two rotary halves interleaved."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)


def random_k_quant(rows: int, cols: int, kind: Q, rng: np.random.Generator) -> np.ndarray:
    """Random blocks with small, finite scales (gguf can dequantize but not quantize these)."""
    at, (values, block) = K_BLOCKS[kind], GGML_QUANT_SIZES[kind]
    raw = rng.integers(0, 256, (rows, cols // values, block), dtype=np.uint8)
    scale = np.frombuffer(np.float16(2e-5 if kind == Q.Q6_K else 1e-4).tobytes(), np.uint8)
    for i in at:   # d, and dmin where the type has one
        raw[..., i:i + 2] = scale
    return raw.reshape(rows, -1)


def encode_tensor(w: np.ndarray, kind: Q, rng) -> tuple[np.ndarray, np.ndarray]:
    """(the GGUF payload, the float32 weights it stands for)."""
    if kind in K_BLOCKS:
        raw = random_k_quant(*w.shape, kind, rng)
    elif kind == Q.F32:
        raw = w.astype(np.float32)
    else:
        raw = quants.quantize(w.astype(np.float32), kind)
    if kind == Q.Q8_K:   # a type gguf cannot dequantize: no reference weights
        return raw, np.zeros(w.shape, np.float32)
    return raw, quants.dequantize(raw, kind).reshape(w.shape).astype(np.float32)


def trained_vocab() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(["hello world, what is the capital of France? 12 34 " * 3, "def f(x): return x"],
                            trainer)
    return tok


def write_gguf(path: Path, types: dict, tied: bool, arch: str = "llama", seed: int = 0,
               meta: dict | None = None) -> dict:
    """A tiny Llama GGUF; returns the HF state dict it encodes (dequantized, un-permuted).
    `meta` replaces metadata values (keys without the `llama.` prefix), with their Python type."""
    rng = np.random.default_rng(seed)
    model = json.loads(trained_vocab().to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    vocab = len(tokens)
    w = GGUFWriter(str(path), arch)
    hparams = {"block_count": LAYERS, "context_length": 128, "embedding_length": HIDDEN, "feed_forward_length": FFN,
               "attention.head_count": HEADS, "attention.head_count_kv": KV_HEADS, "rope.freq_base": 10000.0,
               "attention.layer_norm_rms_epsilon": 1e-5}
    for key, value in {**hparams, **(meta or {})}.items():
        put = {int: w.add_uint32, float: w.add_float32, str: w.add_string}[type(value)]
        put(f"{arch}.{key}", value)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3 if t.startswith("<|") else 1 for t in tokens])
    w.add_token_merges([" ".join(m) for m in model["merges"]])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(TEMPLATE)
    state: dict[str, np.ndarray] = {}

    def add(gguf_name: str, hf_name: str, shape: tuple, kind: Q, n_head: int | None = None):
        weights = rng.normal(0, 0.02 if "embd" in gguf_name else 0.08, shape).astype(np.float32)
        if "norm" in gguf_name:
            weights = 1 + weights
        raw, ref = encode_tensor(weights, kind, rng)
        if n_head:   # quantization is per row, so permuting the rows commutes with it
            raw = llama_cpp_permute(raw, n_head)
        w.add_tensor(gguf_name, raw, raw_dtype=kind if kind != Q.F32 else None)
        state[hf_name] = ref

    add("token_embd.weight", "model.embed_tokens.weight", (vocab, HIDDEN), types.get("token_embd", Q.F32))
    for i in range(LAYERS):
        layer = types.get(i, {})
        hd = HIDDEN // HEADS
        for name, shape, heads in [("attn_q", (HIDDEN, HIDDEN), HEADS), ("attn_k", (KV_HEADS * hd, HIDDEN), KV_HEADS),
                                   ("attn_v", (KV_HEADS * hd, HIDDEN), None), ("attn_output", (HIDDEN, HIDDEN), None),
                                   ("ffn_gate", (FFN, HIDDEN), None), ("ffn_up", (FFN, HIDDEN), None),
                                   ("ffn_down", (HIDDEN, FFN), None)]:
            add(f"blk.{i}.{name}.weight", f"model.layers.{i}.{HF_LAYER[name]}.weight", shape,
                layer.get(name, Q.F32), heads)
        for name in ("attn_norm", "ffn_norm"):
            add(f"blk.{i}.{name}.weight", f"model.layers.{i}.{HF_LAYER[name]}.weight", (HIDDEN,), Q.F32)
    add("output_norm.weight", "model.norm.weight", (HIDDEN,), Q.F32)
    if not tied:
        add("output.weight", "lm_head.weight", (vocab, HIDDEN), types.get("output", Q.F32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return state


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


def test_second_load_reuses_the_conversion(tmp_path, home):
    path = tmp_path / "tiny.gguf"
    write_gguf(path, {}, tied=True)
    load_model(str(path))
    converted = sorted((home / "gguf").iterdir())
    assert len(converted) == 1 and (converted[0] / "model.safetensors").is_file()
    stamp = (converted[0] / "model.safetensors").stat().st_mtime_ns
    load_model(str(path))
    assert sorted((home / "gguf").iterdir()) == converted
    assert (converted[0] / "model.safetensors").stat().st_mtime_ns == stamp


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
    ({"embedding_length": "wide"}, "llama.embedding_length 'wide' and llama.attention.head_count"),
    ({"attention.layer_norm_rms_epsilon": "x"}, "llama.attention.layer_norm_rms_epsilon should be a number"),
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
