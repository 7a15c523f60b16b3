"""What several test modules share, in one module (imported as `helpers`, one name: tests/test_layering.py).

No test module imports another test module; what two of them need lives here, grouped by the
module it came from.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGUFWriter, quants
from gguf import GGMLQuantizationType as Q
from tokenizers import Regex, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from chatapp.chat.events import TextDelta, TurnStats
from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from chatapp.keeper.keeper import ChatKeeper
from kvcache import Attention
from model.chat_formats.recognize import template_for
from model.chat_formats.templates import ChatML, Llama3, NanochatFormat, Qwen3, encode_rendered
from model.cpu.blocks import repack
from model.cpu.qlinear import QLinear
from model.decode.generate import Generator
from model.decode.sampling import SamplingConfig
from model.families.llama import Llama, LlamaConfig
from model.families.nanochat import Nanochat
from model.families.nanochat_config import NanochatConfig
from model.loading import LoadedModel, LoadOptions, load_model
from model.tokenizers.safe_pickle import load_encoding
from model.tokenizers.tokenizer import Tokenizer, byte_level_encoding

# --- the GPU tests: eager against the graph ---------------------------------------------------

def share_prefill(graph: Generator, eager: Generator, ids: list[int]) -> None:
    """Give eager the graph's prefill K/V, then recompute its last prompt token over them (so
    its logits belong to that history)."""
    p = len(ids)
    eager.cache.k_cache[:, :, :p].copy_(graph.cache.k_cache[:, :, :p])
    eager.cache.v_cache[:, :, :p].copy_(graph.cache.v_cache[:, :, :p])
    eager.cache.rewind(p - 1)
    eager.forget()
    eager.prefill(ids[-1:])


# The fused decode step against eager on random weights, teacher-forced (H200): the plain graph
# 7 ulps; the fused one 13-14 on the trajectory the bit-exact modules prefill gave (the old bound,
# 16, came from it), and 15 (200 tokens), 19 (Llama-1B shape, 120) and 20 (60 after a padded
# bucket) on the trajectories of the fused prefill, with the history shared and the padding
# poisoned, so no wrong key is read; 85-92% of steps exact. A wrong position or a stale key is
# off by hundreds of ulps on most steps.
RANDOM_GAP_ULPS, EXACT_SHARE = 32, 0.75


def assert_decode_noise(gaps: list[float]) -> None:
    """Every teacher-forced gap within bf16 noise of random weights, and most steps exact."""
    assert max(gaps) <= RANDOM_GAP_ULPS, max(gaps)
    assert sum(g == 0 for g in gaps) >= EXACT_SHARE * len(gaps), sum(g == 0 for g in gaps)


# --- the OpenAI-compatible server, running ----------------------------------------------------

@contextlib.contextmanager
def running(lm, queue_size: int = 128, slots: int = 3, api_keys: tuple[str, ...] = (), context: int = 512,
            max_new_tokens: int = 6, log=lambda line: None):
    # imported here: the GPU machine has no starlette or httpx, and conftest imports this module
    import httpx

    from chatapp.serve.app import make_app
    from chatapp.serve.engine import Engine
    from chatapp.serve.kvlru import SnapshotLRU
    from chatapp.serve.main import Server, bind

    defaults = Settings(temperature=0, max_new_tokens=max_new_tokens)
    engine = Engine(Session(lm, Settings(**vars(defaults)), context=context), defaults, queue_size,
                    SnapshotLRU(slots))
    server = Server(make_app(engine, api_keys, log), bind("127.0.0.1", 0)).start()
    base = server.url.removesuffix("/v1")
    for _ in range(200):
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                break
        time.sleep(0.02)
    try:
        yield server, engine
    finally:
        server.stop()
        engine.close()


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


# --- BPE tokenizers trained for the tests -----------------------------------------------------

CORPUS = Path(__file__).parent / "data" / "tokenizer_corpus.jsonl"


BPE_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


PRE = {
    "gpt2": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False),
    "smollm": lambda: pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                               pre_tokenizers.ByteLevel(add_prefix_space=False)]),
    "llama3": lambda: pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
}


def corpus() -> list[str]:
    return [json.loads(line)["text"] for line in CORPUS.read_text(encoding="utf-8").splitlines()]


def train(pre: str, texts: list[str], vocab_size: int = 1500) -> HFTokenizer:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = PRE[pre]()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=BPE_SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts * 3, trainer)
    return tok


# --- the vendors' chat templates and their reference renderer ---------------------------------

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"


CHATML = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


LLAMA = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


# template file: (special tokens, bos, eos, the format it must be recognised as)
VENDORS = {
    "Qwen-Qwen2.5-7B-Instruct": (CHATML, None, "<|im_end|>", ChatML),
    "Qwen-Qwen3-0.6B": (CHATML + ["<think>", "</think>"], None, "<|im_end|>", Qwen3),
    "meta-llama-Llama-3.2-3B-Instruct": (LLAMA, "<|begin_of_text|>", "<|eot_id|>", Llama3),
    "HuggingFaceTB-SmolLM2-135M-Instruct": (CHATML, None, "<|im_end|>", ChatML),
}


def source(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")


def messages(system: str | None, users: list[str], replies: list[str]) -> list[dict]:
    msgs = [] if system is None else [{"role": "system", "content": system}]
    for u, r in zip(users, replies, strict=False):
        msgs += [{"role": "user", "content": u}, {"role": "assistant", "content": r}]
    return msgs + [{"role": "user", "content": users[len(replies)]}]


def official(name: str, msgs: list[dict]) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template as reference

    _, bos, eos, _ = VENDORS[name]
    out, _ = reference([msgs], chat_template=source(name), add_generation_prompt=True, bos_token=bos, eos_token=eos)
    return out[0]


# --- tiny Hugging Face Llama, Qwen2, Qwen3 folders --------------------------------------------

HF_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
            "<|end_header_id|>", "<|eot_id|>", "<think>", "</think>"]


QWEN25 = (TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()


QWEN3 = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()


LLAMA3 = (TEMPLATES / "meta-llama-Llama-3.2-3B-Instruct.jinja").read_text()


SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6)


# Wavelengths 6.3, 20, 63, 200, ... against an original context of 64: all three llama3 bands.
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}


VARIANTS = {   # name: (transformers config class, its extra settings, chat template, EOS)
    "llama3-untied": ("LlamaConfig", dict(rope_theta=10000.0, rope_scaling=LLAMA3_ROPE, tie_word_embeddings=False),
                      LLAMA3, "<|eot_id|>"),
    "qwen2-tied": ("Qwen2Config", dict(rope_theta=1000.0, tie_word_embeddings=True), QWEN25, "<|im_end|>"),
    "qwen3-untied": ("Qwen3Config", dict(head_dim=32, tie_word_embeddings=False), QWEN3, "<|im_end|>"),
}


def tiny_tokenizer() -> HFTokenizer:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=HF_SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["hello there, how are you? the capital of France is Paris. 12 34"] * 3, trainer)
    return tok


def spread_weights(model: torch.nn.Module, seed: int) -> None:
    """Wide random weights: norms around 1, everything else (biases included) N(0, 0.3)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.2 * noise if "norm" in name else 0.3 * noise)


def save_variant(d: Path, name: str, seed: int = 0) -> torch.nn.Module:
    import transformers

    cls, extra, template, eos = VARIANTS[name]
    tok = tiny_tokenizer()
    cfg = getattr(transformers, cls)(vocab_size=tok.get_vocab_size(), **SHAPE, **extra)
    model_cls = getattr(transformers, cls.replace("Config", "ForCausalLM"))
    hf = model_cls(cfg).eval()
    spread_weights(hf, seed)
    hf.save_pretrained(d, safe_serialization=True)
    (d / "tokenizer.json").write_text(tok.to_str(), encoding="utf-8")
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "eos_token": eos,
                                                         "bos_token": "<|begin_of_text|>"}))
    return hf


# --- GGUF files as llama.cpp writes them ------------------------------------------------------

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


def trained_vocab() -> HFTokenizer:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(["hello world, what is the capital of France? 12 34 " * 3, "def f(x): return x"],
                            trainer)
    return tok


def llama_hparams(layers: int, hidden: int, ffn: int, heads: int, kv_heads: int, context: int) -> dict:
    """A tiny Llama's `llama.*` metadata (keys without the prefix)."""
    return {"block_count": layers, "context_length": context, "embedding_length": hidden, "feed_forward_length": ffn,
            "attention.head_count": heads, "attention.head_count_kv": kv_heads, "rope.freq_base": 10000.0,
            "attention.layer_norm_rms_epsilon": 1e-5}


def add_hparams(w: GGUFWriter, arch: str, values: dict) -> None:
    """`<arch>.<key>` metadata, each as its Python type says (int: uint32, float: float32, str)."""
    for key, value in values.items():
        {int: w.add_uint32, float: w.add_float32, str: w.add_string}[type(value)](f"{arch}.{key}", value)


def add_bpe_vocab(w: GGUFWriter, tokens: list[str], merges: list, bos: int, eos: int) -> None:
    """A byte-level BPE vocabulary as llama.cpp writes SmolLM2's (specials are <|...|>)."""
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3 if t.startswith("<|") else 1 for t in tokens])
    w.add_token_merges([" ".join(m) for m in merges])
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)


def add_random_llama(w: GGUFWriter, n_tokens: int, layers: int, hidden: int, ffn: int) -> None:
    """F32 tensors of a tiny MHA Llama with a tied head, from a fixed seed (norms near 1)."""
    rng = np.random.default_rng(0)

    def add(name: str, shape: tuple):
        w.add_tensor(name, (1 + rng.normal(0, 0.02, shape) if "norm" in name else
                            rng.normal(0, 0.5, shape)).astype(np.float32))

    add("token_embd.weight", (n_tokens, hidden))
    for i in range(layers):
        for part, shape in [("attn_q", (hidden, hidden)), ("attn_k", (hidden, hidden)), ("attn_v", (hidden, hidden)),
                            ("attn_output", (hidden, hidden)), ("ffn_gate", (ffn, hidden)), ("ffn_up", (ffn, hidden)),
                            ("ffn_down", (hidden, ffn)), ("attn_norm", (hidden,)), ("ffn_norm", (hidden,))]:
            add(f"blk.{i}.{part}.weight", shape)
    add("output_norm.weight", (hidden,))


def close_gguf(w: GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_gguf(path: Path, types: dict, tied: bool, arch: str = "llama", seed: int = 0,
               meta: dict | None = None) -> dict:
    """A tiny Llama GGUF; returns the HF state dict it encodes (dequantized, un-permuted).
    `meta` replaces metadata values (keys without the `llama.` prefix), with their Python type."""
    rng = np.random.default_rng(seed)
    model = json.loads(trained_vocab().to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    vocab = len(tokens)
    w = GGUFWriter(str(path), arch)
    add_hparams(w, arch, {**llama_hparams(LAYERS, HIDDEN, FFN, HEADS, KV_HEADS, 128), **(meta or {})})
    add_bpe_vocab(w, tokens, model["merges"], bos=1, eos=2)
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
    close_gguf(w)
    return state


# --- headless mode in a subprocess ------------------------------------------------------------

BASE = [sys.executable, "-m", "chatapp.cli", "--headless", "--model", "random:tiny", "--temperature", "0",
        "--max-new-tokens", "8"]


def headless(stdin: bytes, *extra: str, timeout=120):
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    p = subprocess.run(BASE + list(extra), input=stdin, capture_output=True, timeout=timeout, env=env)
    lines = p.stdout.decode().splitlines()
    return p, [json.loads(line) for line in lines]  # every stdout line must be JSON


# --- quantized weights ------------------------------------------------------------------------

ROWS, COLS = 24, 512


def gguf_blocks(kind: str, rng) -> np.ndarray:
    t = Q[kind]
    if t in K_BLOCKS:
        return random_k_quant(ROWS, COLS, t, rng)
    return quants.quantize(rng.normal(0, 1, (ROWS, COLS)).astype(np.float32), t)


def packed_linear(kind: str, seed: int = 0) -> tuple[QLinear, np.ndarray]:
    raw = gguf_blocks(kind, np.random.default_rng(seed))
    p = repack(kind, raw, ROWS, COLS)
    ql = QLinear(p.kind, torch.from_numpy(p.q), torch.from_numpy(p.scale),
                 None if p.min is None else torch.from_numpy(p.min))
    return ql, quants.dequantize(raw, Q[kind]).reshape(ROWS, COLS).astype(np.float32)


def bits(a) -> np.ndarray:
    """Bit patterns, with -0.0 read as 0.0: gguf computes Q4_0 as (q - 8) d, which gives -0.0
    for q = 8 under a negative d, where our q d + (-8 d) gives 0.0: the same number."""
    return (np.asarray(a, dtype=np.float32) + np.float32(0)).view(np.int32)


def int16_reference(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """W x with x rounded to int16 per 32 as the kernels do (to +-32639, which splits into two
    signed bytes), in float64."""
    xb = x.reshape(-1, 32).astype(np.float32)
    d = np.abs(xb).max(axis=1, keepdims=True) / np.float32(32639)
    q = np.rint(xb / np.where(d > 0, d, 1)) * (d > 0)
    return w.astype(np.float64) @ (q * d).reshape(-1).astype(np.float64)


def int8_round(x: np.ndarray, group: int = 32) -> np.ndarray:
    """x rounded to int8, one scale per `group` values, as quantize_k8 takes it for the K-quant rows:
    a step of 1/127 of the group's largest magnitude, q = rint(x * (1 / step)) in fp32."""
    xb = x.reshape(-1, group).astype(np.float32)
    d = np.abs(xb).max(axis=1, keepdims=True) / np.float32(127)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), np.float32(0)).astype(np.float32)
    return (np.rint(xb * inv) * d).reshape(-1)


def int8_error(x: np.ndarray) -> float:
    """The int8 rounding's relative error |x - round(x)| / |x|: quantize_k8 takes the int8 path when
    it is at most K8_MAX_ERR."""
    return float(np.linalg.norm(x - int8_round(x)) / np.linalg.norm(x))


K8_MAX_ERR = 0.007   # qdecode.c's
# The types whose rows may take int8 activations (qformats.h's a8), in every build.
ACT8_TYPES = ("Q4_K", "Q5_K", "Q6_K")


def act_reference(kind: str, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """W x with the activations the kernels give rows of `kind` (a GGUF type name), in float64."""
    if kind in ACT8_TYPES and int8_error(x) <= K8_MAX_ERR:
        return w.astype(np.float64) @ int8_round(x).astype(np.float64)
    return int16_reference(w, x)


# The C step's logits against the fp32 reference, as a share of the largest: int16 activations and
# an fp16 cache stay within 5e-3; a model with K-quant rows (int8 activations where their rounding
# error is small, ACT8_TYPES) within 2.5e-2.
LOGITS_REL, LOGITS_REL_ACT8 = 5e-3, 2.5e-2


def assert_greedy_within(ref: torch.nn.Module, tokens: list[int], start: int, n: int, rel: float) -> int:
    """Each of tokens[start:start + n] (a greedy reply of the C step) is the fp32 reference's pick
    after the tokens before it, or within `rel` of its largest logit: a near-tie of a random-weight
    model that the K-quant rows' int8 rounding may break the other way. Returns the exact picks."""
    with torch.no_grad():
        logits = ref(torch.tensor([tokens[:start + n]]), ref.new_cache(start + n + 1))[0]
    exact = 0
    for p in range(start, start + n):
        row = logits[p - 1]
        assert row[tokens[p]] >= row.max() - rel * row.abs().max(), f"position {p}: not a near-greedy pick"
        exact += int(row.argmax()) == tokens[p]
    return exact


def assert_close_logits(a: torch.Tensor, b: torch.Tensor, rel: float = LOGITS_REL) -> None:
    """Within `rel` of the reference's largest logit, and the same pick."""
    assert (a - b).abs().max().item() <= rel * b.abs().max().item()
    assert int(a.argmax()) == int(b.argmax())


def both(path):
    return load_model(str(path), LoadOptions(quantized=True)), load_model(str(path))


def spied_pair(path, monkeypatch, owner, name: str, capacity: int = 160):
    """The quantized model and the fp32 reference of one GGUF, each in a Generator, with
    `owner.name` wrapped to count its calls (that the path under test really ran):
    (quantized model, its generator, the reference's, the calls)."""
    q, ref = both(path)
    calls: list[int] = []
    real = getattr(owner, name)
    monkeypatch.setattr(owner, name, lambda *a: calls.append(1) or real(*a))
    gq = Generator(q.model, q.model.new_cache(capacity), q.tokenizer.vocab_size)
    gr = Generator(ref.model, ref.model.new_cache(capacity), ref.tokenizer.vocab_size)
    assert gq.cpu_step is not None and gr.cpu_step is None
    return q, gq, gr, calls


# --- block formats ----------------------------------------------------------------------------

# Where each type keeps its fp16 scales (d, and dmin for Q2_K) inside a block.
SCALES_AT = {"Q5_0": (0,), "IQ4_NL": (0,), "IQ4_XS": (0,), "Q6_K": (208,), "Q2_K": (80, 82), "Q3_K": (108,),
             "Q4_K": (0, 2), "Q5_K": (0, 2)}


def random_blocks(kind: str, rows: int, cols: int, rng) -> np.ndarray:
    """Every bit pattern of values and sub-scales, with finite fp16 scales of either sign."""
    values, size = GGML_QUANT_SIZES[Q[kind]]
    raw = rng.integers(0, 256, (rows, cols // values, size), dtype=np.uint8)
    for at in SCALES_AT[kind]:
        d = rng.uniform(-2e-3, 2e-3, raw.shape[:2]).astype(np.float16)
        raw[..., at:at + 2] = d[..., None].view(np.uint8)
    return raw.reshape(rows, -1)


# --- a store another user owns ----------------------------------------------------------------

NOBODY = 65534


DROP = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
        "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]


def as_other_user() -> list[str]:
    """The command prefix that runs a program as a user who cannot write the store."""
    if os.geteuid() != 0:
        return []  # the chmod in `readonly_store` is enough for a plain user
    if shutil.which("setpriv") is None:
        pytest.skip("running as root and setpriv is missing: cannot drop privileges")
    probe = subprocess.run([*DROP, sys.executable, "-c", "import os, chatapp; print(os.geteuid())"],
                           capture_output=True, text=True)
    if probe.returncode != 0 or probe.stdout.strip() != str(NOBODY):
        pytest.skip(f"cannot run as uid {NOBODY} with setpriv: {probe.stderr.strip()[-300:]}")
    return DROP


# --- the session's invariant, and turns that fail ---------------------------------------------

def run(events):
    return list(events)


def turn_of(events) -> TurnStats:
    (st,) = [e for e in events if isinstance(e, TurnStats)]
    return st


def assert_invariant(s: Session, atol: float = 1e-5, rtol: float = 1e-4):
    """The cache holds exactly tokens[:cache_seqlens] (docs/cache-invariant.md): its K/V (and so
    any per-position state feeding them) equal a fresh prefill of those tokens. A quantized
    model's fp16 cache, which the C step wrote with int16 activations, within `atol`/`rtol`."""
    pos = s.cache.seqlen
    assert pos <= len(s.tokens)
    fresh = s.lm.model.new_cache(s.cache.capacity)
    if pos:
        with torch.no_grad():
            s.lm.model(torch.tensor([s.tokens[:pos]]), fresh)
    for got, want in ((s.cache.k_cache, fresh.k_cache), (s.cache.v_cache, fresh.v_cache)):
        torch.testing.assert_close(got[:, :, :pos].float(), want[:, :, :pos].float(), atol=atol, rtol=rtol)


def assert_transcript(s: Session):
    """The token list equals the template rendered over the whole transcript."""
    t = s.template
    want = t.start(s.system)
    for ex in s.exchanges:
        want += t.user_turn(ex.user) + s.tokens[ex.reply_start:ex.end - len(t.end_reply())] + t.end_reply()
        assert s.tokenizer.decode(s.tokens[ex.reply_start:ex.end - len(t.end_reply())]) == ex.reply
    assert s.tokens == want


class Poison:
    """Turns the real model's final norm to NaN, as a corrupt checkpoint would, and back."""

    def __init__(self, lm):
        self.w = lm.model.get_parameter("model.norm.weight")
        self.saved = self.w.detach().clone()

    def __call__(self) -> None:
        with torch.no_grad():
            self.w.fill_(float("nan"))

    def heal(self) -> None:
        with torch.no_grad():
            self.w.copy_(self.saved)


def fail_mid_reply(events, poison: Poison) -> list:
    """Drain a turn, poisoning the model after the first streamed text: the next sample meets NaN."""
    out = []
    try:
        for ev in events:
            out.append(ev)
            if isinstance(ev, TextDelta):
                poison()
    finally:
        poison.heal()
    return out


# --- stored chats and their KV snapshots ------------------------------------------------------

def new_keeper(lm, store, context=1024) -> ChatKeeper:
    return ChatKeeper(Session(lm, Settings(temperature=0.0, max_new_tokens=8), context=context), store)


def talk(keeper: ChatKeeper, *msgs: str) -> None:
    for m in msgs:
        events = list(keeper.send(m))
        assert not [e for e in events if getattr(e, "event", "") == "error"], events


def reopen(lm, store, chat_id, context=1024):
    k = new_keeper(lm, store, context)
    restored, errors = k.open(chat_id)
    assert not errors
    return k, restored


# --- a scripted Qwen3 (thinking) --------------------------------------------------------------

QWEN3_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]


SCRIPT = "<think>Plan</think>Hi!<|im_end|>"  # distinct tokens: each one names its successor


def scripted_qwen3() -> LoadedModel:
    """A Llama whose greedy reply after the assistant header is SCRIPT: the script's token
    embeddings are orthogonal and lm_head maps each to its successor; attention and MLPs
    still run (scaled down) and write the cache."""
    tok = Tokenizer(byte_level_encoding("bytes-qwen3", QWEN3_SPECIALS), eos="<|endoftext|>")
    fmt = template_for(tok, source("Qwen-Qwen3-0.6B"))
    assert isinstance(fmt, Qwen3)
    script = encode_rendered(tok, "\n" + SCRIPT)  # "\n": the header's last token starts it
    assert len(set(script)) == len(script)
    cfg = LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Llama(cfg, Attention("sdpa"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.02 if "proj" in name and ("o_proj" in name or "down" in name) else 0.1)
        basis = torch.linalg.qr(torch.randn(64, 64))[0].T * 8.0
        for i, t in enumerate(script):
            model.model.embed_tokens.weight[t] = basis[i]
        model.lm_head.weight.zero_()
        for i, nxt in enumerate(script[1:]):
            model.lm_head.weight[nxt] += 0.5 * basis[i]
    return LoadedModel(model.eval(), tok, fmt, "scripted qwen3", cfg.max_position_embeddings)


# --- a scripted nanochat that calls its calculator --------------------------------------------

TOKENIZER = Path(__file__).parent / "fixtures" / "nanochat" / "tokenizer" / "tokenizer.pkl"


def scripted(expr: str, after: str) -> LoadedModel:
    """Replies <|python_start|>expr<|python_end|>, then (after any tool output) `after`."""
    tok = Tokenizer(load_encoding(TOKENIZER), bos="<|bos|>")
    t = NanochatFormat(tok)
    tt = t.tool_tokens
    call = [t.assistant_start, tt["python_start"], *tok.encode(expr), tt["python_end"]]
    tail = [*tok.encode(after), t.assistant_end]
    edges = list(zip(call, call[1:], strict=False)) + list(zip(tail, tail[1:], strict=False))
    edges += [(tt["python_end"], tail[0]), (tt["output_end"], tail[0])]
    nodes = sorted({a for a, _ in edges})
    assert len(set(call + tail)) == len(call + tail), "script tokens must be distinct"

    cfg = NanochatConfig.for_generation("2026-03-14", sequence_len=256, vocab_size=300, padded_vocab_size=320,
                                        n_layer=2, n_head=2, n_kv_head=1, n_embd=32)
    torch.manual_seed(0)
    model = Nanochat(cfg, Attention("sdpa"))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
        for block in model.transformer.h:  # keep the residual stream close to the embedding
            block.attn.c_proj.weight.mul_(0.05)
            block.mlp.c_proj.weight.mul_(0.05)
        model.resid_lambdas.fill_(1.0)
        model.x0_lambdas.fill_(0.1)
        model.smear_lambda.fill_(0.1)
        model.backout_lambda.fill_(0.1)
        basis = torch.linalg.qr(torch.randn(cfg.n_embd, cfg.n_embd))[0].T * cfg.n_embd ** 0.5
        for i, a in enumerate(nodes):
            model.transformer.wte.weight[a] = basis[i]
        model.lm_head.weight.zero_()
        for a, b in edges:
            model.lm_head.weight[b] += 4.0 * basis[nodes.index(a)] / cfg.n_embd ** 0.5
    model.eval()
    return LoadedModel(model, tok, t, "scripted nanochat", cfg.sequence_len)


# --- greedy decoding through the Generator ----------------------------------------------------


def greedy(gen: Generator, prompt: list[int], n: int) -> list[int]:
    """`n` tokens sampled at temperature 0 after `prompt` (the cache emptied first), each fed back."""
    gen.configure(SamplingConfig(temperature=0.0))
    gen.cache.reset()
    gen.forget()
    gen.prefill(prompt)
    out = []
    for _ in range(n):
        out.append(gen.sample())
        gen.feed(out[-1])
    return out


def cpu_burning_llama_bench(tmp_path: Path, ms: float, per: str = "-n") -> str:
    """A stand-in llama-bench for the CPU-time benches: it spends `ms` of CPU for each unit of its
    `per` argument (`-n`: a decode token, `-r`: a repetition) plus a fixed part (its load and
    warm-up), which the benches' difference of two runs must cancel. The fixed part is 60 ms of
    CPU counted from the process's start, so the interpreter's own start-up (which varied by tens
    of ms between two runs on a loaded machine) is inside it rather than added to it."""
    script = tmp_path / "llama-bench"
    script.write_text(f"""#!{sys.executable}
import sys, time
n = int(sys.argv[sys.argv.index({per!r}) + 1])
end = max(time.process_time(), 0.060) + n * {ms} / 1000
while time.process_time() < end:
    pass
print("[]")
""")
    script.chmod(0o755)
    return str(script)

