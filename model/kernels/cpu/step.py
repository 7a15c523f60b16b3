"""The CPU decode step of a quantized Llama-shaped model: one C call a token (qdecode.c).

The step reads the model's QLinear buffers and the persistent KV cache in place: it writes
the new token's K/V at `cache.pos` and advances the cache like any forward would, so the
cache invariant (docs/cache-invariant.md) holds after it exactly as after a prefill.
"""

from __future__ import annotations

import ctypes

import torch

from kvcache import KVCache
from model.kernels.cpu import native


def build_cpu_step(model: torch.nn.Module, cache: KVCache) -> CpuStep | None:
    """The C step for a model whose linears are QLinears (a GGUF on the CPU's default path),
    else None (the eager forward decodes)."""
    from model.llama import Llama  # lazy: model.llama imports the kvcache this module sits beside
    from model.quant.qlinear import QLinear

    if not isinstance(model, Llama) or not isinstance(model.lm_head, QLinear) or native.library() is None:
        return None
    return CpuStep(model, cache)


class CpuStep:
    def __init__(self, model: torch.nn.Module, cache: KVCache, threads: int | None = None):
        c = model.config
        if cache.dtype != torch.float16 or cache.k_cache.shape[1] != 1:
            raise ValueError("the CPU step needs a single-sequence fp16 cache")
        cos, sin = model.rope(torch.device("cpu"))
        if cache.capacity > cos.shape[0]:
            raise ValueError(f"cache capacity {cache.capacity} exceeds the rotary tables ({cos.shape[0]})")
        self.lib, self.cache, self.keep = native.library(), cache, [cos, sin]
        self.layers = (native.Layer * c.num_hidden_layers)()
        for layer, blk in zip(self.layers, model.model.layers, strict=True):
            a, mlp = blk.self_attn, blk.mlp
            for field, lin in (("wq", a.q_proj), ("wk", a.k_proj), ("wv", a.v_proj), ("wo", a.o_proj),
                               ("wg", mlp.gate_proj), ("wu", mlp.up_proj), ("wd", mlp.down_proj)):
                setattr(layer, field, lin.qw())
            layer.attn_norm = self._f32(blk.input_layernorm.weight)
            layer.ffn_norm = self._f32(blk.post_attention_layernorm.weight)
            if a.qk_norm:
                layer.q_norm, layer.k_norm = self._f32(a.q_norm.weight), self._f32(a.k_norm.weight)
            layer.cos, layer.sin, layer.window = cos.data_ptr(), sin.data_ptr(), -1
        self.model = native.Model(
            n_layers=c.num_hidden_layers, dim=c.hidden_size, n_head=c.num_attention_heads,
            n_kv=c.num_key_value_heads, head_dim=c.head_dim, hidden=c.intermediate_size, vocab=c.vocab_size,
            cap=cache.capacity, act=0, n_threads=threads or torch.get_num_threads(), eps=c.rms_norm_eps,
            emb_scale=1.0, attn_scale=c.head_dim ** -0.5, final_softcap=0.0,
            embed=model.model.embed_tokens.table.qw(), lm_head=model.lm_head.qw(),
            final_norm=self._f32(model.model.norm.weight), layers=self.layers)
        self.ctx = self.lib.qd_new(ctypes.byref(self.model))
        if not self.ctx:
            raise MemoryError("the CPU step could not allocate its scratch buffers")
        self.logits = torch.empty(c.vocab_size)
        self.owner = model   # the buffers the pointers lead into live as long as the model

    def _f32(self, t: torch.Tensor) -> int:
        t = t.detach().float().contiguous()
        self.keep.append(t)
        return t.data_ptr()

    def __call__(self, tok: int) -> torch.Tensor:
        """Logits of `tok` fed at cache.pos; the cache advances by one."""
        c = self.cache
        c.check_fits(1)
        rc = self.lib.qd_step(self.ctx, int(tok), c.pos, c.k_cache.data_ptr(), c.v_cache.data_ptr(),
                              self.logits.data_ptr())
        if rc != 0:
            raise ValueError(f"token id {tok} is outside the vocabulary")
        c.advance(1)
        return self.logits

    def __del__(self):
        if getattr(self, "ctx", None):
            self.lib.qd_free(self.ctx)
            self.ctx = None
