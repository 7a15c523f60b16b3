"""Gemma 3 GGUF files (`general.architecture = gemma3`): tensor names, metadata, tokenizer.

Hooked into gguf.py / gguf_meta.py by architecture; the conversion itself (dequantize to
fp32, write the canonical directory) is theirs. What llama.cpp's converter does differently
for Gemma 3, and what we undo here:
- it adds 1 to every RMSNorm weight (its norm multiplies by the weight, Gemma's by 1 + weight),
  so we subtract 1 (transformers' GGUF loader does the same);
- it does not permute Q/K rows (only its llama architecture does), so nothing to undo;
- the metadata has one rotary base (the global layers'); the local one (10,000), the layer
  pattern (every 6th layer global) and the query scale are fixed by llama.cpp's gemma3
  code, not stored, so we use the same values.
"""

from __future__ import annotations

import numpy as np

from model.errors import ModelLoadError
from model.families.gemma import FULL, SLIDING, GemmaConfig
from model.loading.gguf_vocab import spm_tokenizer_files

ARCH = "gemma3"
MODEL_TYPE = "gemma3_text"
LAYER_NAMES = {
    "attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
LOCAL_ROPE_BASE = 10_000.0   # llama.cpp's gemma3 rope_freq_base_train_swa; not in the file
PATTERN = 6                  # llama.cpp's gemma3 swa pattern: layers 5, 11, 17, ... are global


def hf_name(name: str, where: str) -> str:
    if name in TOP_NAMES:
        return TOP_NAMES[name]
    blk, n, part, kind = (name.split(".") + ["", "", "", ""])[:4]
    if blk == "blk" and n.isdigit() and part in LAYER_NAMES and kind == "weight" and name.count(".") == 3:
        return f"model.layers.{n}.{LAYER_NAMES[part]}.weight"
    raise ModelLoadError(f"{where}: unexpected tensor {name!r} (supported: Gemma 3 text tensors)")


def fix_tensor(name: str, w: np.ndarray) -> np.ndarray:
    """Undo the converter's +1 on norm weights (see the module docstring)."""
    return w - np.float32(1.0) if name.endswith("norm.weight") else w


def hf_config(g, name: str, f32, refuse) -> dict:
    """config.json for Gemma3ForCausalLM from the `gemma3.*` metadata; `f32` reads a float
    key and `refuse` refuses by metadata key, as gguf_meta does."""
    a = ARCH
    refuse(g, [(f"{a}.attn_logit_softcapping", bool, "attention logit softcapping is not supported"),
               (f"{a}.expert_count", bool, "mixture-of-experts models are not supported")])
    heads = g.need(f"{a}.attention.head_count")
    kv = g.get(f"{a}.attention.head_count_kv", heads)
    if not isinstance(heads, int) or not isinstance(kv, int):
        raise ModelLoadError(f"{g.path}: per-layer head counts are not supported")
    hidden, layers = g.need(f"{a}.embedding_length"), g.need(f"{a}.block_count")
    head_dim = g.get(f"{a}.attention.key_length", hidden // max(heads, 1))
    if g.get(f"{a}.attention.value_length", head_dim) != head_dim:
        raise ModelLoadError(f"{g.path}: {a}.attention.value_length differs from key_length (not supported)")
    scaling, factor = g.get(f"{a}.rope.scaling.type", "none"), 1.0
    if scaling == "linear":
        factor = f32(g, f"{a}.rope.scaling.factor")
    elif scaling not in ("none", None):
        raise ModelLoadError(f"{g.path}: {a}.rope.scaling.type {scaling!r} is not supported")
    config = {
        "architectures": ["Gemma3ForCausalLM"], "model_type": MODEL_TYPE,
        "hidden_size": hidden, "intermediate_size": g.need(f"{a}.feed_forward_length"),
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv,
        "head_dim": head_dim, "rms_norm_eps": f32(g, f"{a}.attention.layer_norm_rms_epsilon"),
        "rope_theta": f32(g, f"{a}.rope.freq_base", 1_000_000.0), "rope_local_base_freq": LOCAL_ROPE_BASE,
        "rope_scaling": {"rope_type": "linear", "factor": factor} if factor != 1.0 else None,
        "sliding_window": g.need(f"{a}.attention.sliding_window"),
        "layer_types": [FULL if (i + 1) % PATTERN == 0 else SLIDING for i in range(layers)] if type(layers) is int
        else [],
        # llama.cpp scales by 1/sqrt(head_dim), except Gemma 3 27B (62 layers): 1/sqrt(hidden/heads).
        "query_pre_attn_scalar": hidden // heads if layers == 62 and heads else head_dim,
        "final_logit_softcapping": g.get(f"{a}.final_logit_softcapping") or None,
        "max_position_embeddings": g.get(f"{a}.context_length", 32768),
        "hidden_activation": "gelu_pytorch_tanh", "torch_dtype": "float32", "nanochat_tui_name": name,
    }
    try:
        GemmaConfig.from_dict(config)  # fail on the .gguf's name, not on the converted copy's
    except (ValueError, TypeError) as e:
        raise ModelLoadError(f"{g.path}: {e}") from None
    return config


def tokenizer_files(g) -> tuple[dict, dict]:
    """tokenizer.json and tokenizer_config.json for a Gemma GGUF's SentencePiece vocabulary."""
    return spm_tokenizer_files(g, "gemma", "GemmaTokenizer", 32768)
