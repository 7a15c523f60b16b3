"""Tiny Gemma 3 models for the tests: a SentencePiece-style vocabulary (specials, "\\n" as a
user-defined token, 256 byte tokens, characters and ▁-words), transformers' Gemma3ForCausalLM
with wide random weights saved as a model folder, and the same model as a GGUF file written
the way llama.cpp's converter writes one (norms + 1, no Q/K permutation)."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter, quants

from model.tokenizers.spm_gguf import tokenizer_json_from_gguf

TEMPLATE = (Path(__file__).parent / "data" / "chat_templates" / "google-gemma-3-it.jinja").read_text(encoding="utf-8")
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
CORPUS = "hello there how are you the capital of France is Paris user model terse 1234 ok yes no"
SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6,
             sliding_window=6)   # 5 windowed layers, then 1 global (Gemma 3's pattern); chats run past 6 tokens
VARIANTS = {   # name: transformers config settings beyond SHAPE
    # GGUF-compatible: llama.cpp fixes the local base at 10,000 and the query scale at 1/sqrt(head_dim).
    "plain": dict(query_pre_attn_scalar=16, tie_word_embeddings=True,
                  rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                                   "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}),
    # Gemma's other knobs: a query scale that is not 1/sqrt(head_dim), small rotary bases, a final
    # logit softcap and an untied head.
    "knobs": dict(query_pre_attn_scalar=24, tie_word_embeddings=False, final_logit_softcapping=3.0,
                  rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000.0},
                                   "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}),
}


def tiny_vocab() -> tuple[list[str], list[int]]:
    """(pieces, llama.cpp token types) with every multi-character piece made by one merge."""
    pieces, types = list(SPECIALS), [3] * len(SPECIALS)
    pieces += ["\n", "\n\n"]
    types += [4, 4]
    pieces += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    text = "▁" + CORPUS.replace(" ", "▁")
    chars = sorted(set(text))
    words = sorted({w[:k] for w in ("▁" + w for w in CORPUS.split()) for k in range(2, len(w) + 1)},
                   key=lambda w: (len(w), w))
    pieces += chars + [w for w in words if w not in chars]
    types += [1] * (len(pieces) - len(types))
    return pieces, types


def tiny_tokenizer_json() -> dict:
    pieces, types = tiny_vocab()
    return tokenizer_json_from_gguf({"tokenizer.ggml.tokens": pieces, "tokenizer.ggml.token_type": types}, "tiny")


def spread_weights(model: torch.nn.Module, seed: int) -> None:
    """Wide random weights: norm weights N(0, 0.2) (Gemma scales by 1 + w), the rest N(0, 0.3)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.2 if "norm" in name else 0.3))


def save_tiny(d: Path, variant: str = "plain", seed: int = 0, template: str | None = TEMPLATE):
    import transformers

    vocab = len(tiny_vocab()[0])
    cfg = transformers.Gemma3TextConfig(vocab_size=vocab, **SHAPE, **VARIANTS[variant], pad_token_id=0,
                                        bos_token_id=2, eos_token_id=1)
    hf = transformers.Gemma3ForCausalLM(cfg).eval()
    hf.config._attn_implementation = "eager"   # the reference maths, masks spelled out
    spread_weights(hf, seed)
    hf.save_pretrained(d, safe_serialization=True)
    (d / "tokenizer.json").write_text(json.dumps(tiny_tokenizer_json(), ensure_ascii=False), encoding="utf-8")
    tok_config = {"bos_token": "<bos>", "eos_token": "<eos>"} | ({"chat_template": template} if template else {})
    (d / "tokenizer_config.json").write_text(json.dumps(tok_config), encoding="utf-8")
    return hf


def write_gguf(path: Path, hf, qtype: Q = Q.F32, drop: str | None = None, head_dim: int | None = None,
               truncate: int = 0) -> Path:
    """`hf` as llama.cpp's converter writes a gemma3 GGUF; `drop` leaves a tensor out,
    `head_dim` states a wrong key length, `truncate` cuts that many bytes off the end."""
    c = hf.config
    w = GGUFWriter(str(path), "gemma3")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(head_dim or c.head_dim)
    w.add_value_length(head_dim or c.head_dim)
    w.add_rope_freq_base(c.rope_parameters["full_attention"]["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_sliding_window(c.sliding_window)
    if c.final_logit_softcapping:
        w.add_final_logit_softcapping(c.final_logit_softcapping)
    pieces, types = tiny_vocab()
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(pieces)
    w.add_token_scores([-float(i) for i in range(len(pieces))])
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_chat_template(TEMPLATE)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, c.num_hidden_layers)
    for name, t in hf.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        gname = names.get_name(name.removesuffix(".weight")) + ".weight"
        if gname == drop:
            continue
        data = t.float().numpy()
        if name.endswith("norm.weight"):
            data = data + 1   # llama.cpp's converter: its norms multiply by the weight itself
        if data.ndim == 2 and qtype != Q.F32:
            w.add_tensor(gname, quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gname, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if truncate:
        data = path.read_bytes()
        path.write_bytes(data[:-truncate])
    return path


def dequantized(hf, qtype: Q):
    """A copy of `hf` whose matrices went through `qtype` and back, as the GGUF holds them."""
    import copy

    ref = copy.deepcopy(hf)
    with torch.no_grad():
        for p in ref.parameters():
            if p.ndim == 2 and qtype != Q.F32:
                q = quants.quantize(p.float().numpy(), qtype)
                p.copy_(torch.from_numpy(np.asarray(quants.dequantize(q, qtype), dtype=np.float32)))
    return ref
