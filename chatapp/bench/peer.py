"""The peer: Hugging Face transformers `generate` with a static cache, on our exact weights.

Decode speed is taken from the difference of two timed runs with different numbers of new
tokens, so the prompt's prefill and any per-call setup cancel out.
"""

from __future__ import annotations

import time

import torch

from model.families.gemma import SLIDING, Gemma
from model.families.llama import Llama


def gemma_hf_config(model: Gemma):
    import transformers

    c = model.config
    full = {"rope_type": "default", "rope_theta": c.rope_theta}
    if c.rope_scaling_factor != 1.0:
        full = {"rope_type": "linear", "rope_theta": c.rope_theta, "factor": c.rope_scaling_factor}
    return transformers.Gemma3TextConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
        max_position_embeddings=c.max_position_embeddings, sliding_window=c.sliding_window,
        layer_types=list(c.layer_types), query_pre_attn_scalar=c.query_pre_attn_scalar,
        final_logit_softcapping=c.final_logit_softcapping, tie_word_embeddings=c.tie_word_embeddings,
        rope_parameters={"full_attention": full,
                         SLIDING: {"rope_type": "default", "rope_theta": c.rope_local_base_freq}},
        pad_token_id=0)


def hf_twin(model: Llama | Gemma):
    """A transformers model of the same family (Llama, Qwen2, Qwen3, Gemma 3) holding `model`'s tensors' values."""
    import transformers  # lazy: transformers comes with the test extra

    if isinstance(model, Gemma):
        return _load_twin(model, transformers.Gemma3ForCausalLM, gemma_hf_config(model))
    c = model.config
    family = "Qwen3" if c.qk_norm else "Qwen2" if c.attention_bias else "Llama"
    config_cls, model_cls = getattr(transformers, f"{family}Config"), getattr(transformers, f"{family}ForCausalLM")
    cfg = config_cls(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                     num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
                     num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
                     rope_theta=c.rope_theta, max_position_embeddings=c.max_position_embeddings,
                     tie_word_embeddings=c.tie_word_embeddings, rope_scaling=c.rope_scaling)
    if getattr(cfg, "rope_parameters", None) is not None:  # transformers 5 keeps theta and scaling here
        cfg.rope_parameters.update({"rope_theta": c.rope_theta, **(c.rope_scaling or {})})
    return _load_twin(model, model_cls, cfg)


def _load_twin(model, model_cls, cfg):
    p = model.lm_head.weight
    hf = model_cls(cfg).to(device=p.device, dtype=p.dtype).eval()
    state = {k: v for k, v in model.state_dict().items() if "rotary" not in k}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if "rotary" not in k and not k.endswith(("lm_head.weight", "embed_scale"))]:
        raise RuntimeError(f"weights do not map onto {model_cls.__name__}: {missing[:3]} {unexpected[:3]}")
    return hf


def _generate(hf, ids: torch.Tensor, new: int) -> tuple[float, list[int]]:
    if ids.is_cuda:
        torch.cuda.synchronize()
    t = time.perf_counter()
    out = hf.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                      cache_implementation="static", pad_token_id=0)
    if ids.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t, out[0, ids.shape[1]:].tolist()


def hf_static_decode(model: torch.nn.Module, prompt: list[int], new_tokens: int) -> dict:
    """tok/s of HF's static-cache greedy decode, and its first tokens (to check the weights match)."""
    if not isinstance(model, (Llama, Gemma)):
        return {"skipped": f"no transformers twin for {type(model).__name__}"}
    try:
        hf = hf_twin(model)
        ids = torch.tensor([prompt], device=model.lm_head.weight.device)
        short = max(2, new_tokens // 4)
        with torch.inference_mode():
            _generate(hf, ids, new_tokens)  # warm-up: compiles (if transformers does), fills caches
            t_short, _ = _generate(hf, ids, short)
            t_long, replied = _generate(hf, ids, new_tokens)
    except Exception as e:  # a peer that cannot run is reported, not fatal to our own figures
        return {"skipped": f"transformers failed: {type(e).__name__}: {e}"[:300]}
    rate = (new_tokens - short) / (t_long - t_short) if t_long > t_short else float("nan")
    del hf
    return {"tok_s": rate, "new_tokens": new_tokens, "prompt_tokens": len(prompt), "first_tokens": replied[:16]}
