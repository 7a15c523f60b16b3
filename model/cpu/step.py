"""The CPU decode step of a quantized Llama-shaped or Gemma 3 model: one C call a token (qdecode.c).

The step reads the model's QLinear buffers and the persistent KV cache in place: it writes
the new token's K/V at `cache.seqlen` and advances the cache like any forward would, so the
cache invariant (docs/cache-invariant.md) holds after it exactly as after a prefill.
"""

from __future__ import annotations

import ctypes

import torch

from kvcache import KVCache
from model.cpu import native
from model.cpu.qlinear import QLinear

# A prefill chunk shorter than this goes token by token through the step. The prefill GEMM
# prepares every weight block again on each call (qgemm.c's unpacking), a cost of about eight
# decode steps whatever the chunk's length, so a short prompt by GEMM was slower than decoding
# it: on the Llama-3.2-1B shape (Q4_0, 2 threads, load average 9-10), 4 tokens took 1.01 s by
# GEMM against 0.56 s by steps, 8 1.13/1.12, 12 1.11/1.55, 16 1.12/2.73 (docs/cpu-prefill.md).
STEPS_BELOW = 12


def build_cpu_step(model: torch.nn.Module, cache: KVCache) -> CpuStep | None:
    """The C step for a Llama-shaped or Gemma 3 model (the caller knows which families those are:
    model/decode/steps.py) whose linears are QLinears (a GGUF on the CPU's default path), else
    None (the eager forward decodes)."""
    if not isinstance(model.lm_head, QLinear) or native.library() is None:
        return None
    return CpuStep(model, cache)


class CpuStep:
    def __init__(self, model: torch.nn.Module, cache: KVCache, threads: int | None = None):
        c = model.config
        if cache.dtype != torch.float16 or cache.k_cache.shape[1] != 1:
            raise ValueError("the CPU step needs a single-sequence fp16 cache")
        self.lib, self.cache, self.keep = native.library(), cache, []
        if hasattr(model, "attn"):   # every token it decodes attends in C: the backend names say so
            model.attn.used.add("c")
        self.gemma = hasattr(c, "query_pre_attn_scalar")
        tables = model.rope(torch.device("cpu"))
        tables = tables if self.gemma else {False: tables}
        if cache.capacity > tables[False][0].shape[0]:
            raise ValueError(f"cache capacity {cache.capacity} exceeds the rotary tables ({tables[False][0].shape[0]})")
        self.keep += [t for pair in tables.values() for t in pair]
        self.layers = (native.Layer * c.num_hidden_layers)()
        for i, (layer, blk) in enumerate(zip(self.layers, model.model.layers, strict=True)):
            a, mlp = blk.self_attn, blk.mlp
            for field, lin in (("wq", a.q_proj), ("wk", a.k_proj), ("wv", a.v_proj), ("wo", a.o_proj),
                               ("wg", mlp.gate_proj), ("wu", mlp.up_proj), ("wd", mlp.down_proj)):
                setattr(layer, field, lin.qw())
            layer.attn_norm = self._norm(blk.input_layernorm)
            if self.gemma:   # four norms a layer, q/k norms, a window and a rotary base per layer
                layer.post_attn_norm = self._norm(blk.post_attention_layernorm)
                layer.ffn_norm = self._norm(blk.pre_feedforward_layernorm)
                layer.post_ffn_norm = self._norm(blk.post_feedforward_layernorm)
                layer.window = c.window(i)[0]
                cos, sin = tables[blk.sliding]
            else:
                layer.ffn_norm = self._norm(blk.post_attention_layernorm)
                layer.window = -1
                cos, sin = tables[False]
            if getattr(a, "qk_norm", True) and hasattr(a, "q_norm"):
                layer.q_norm, layer.k_norm = self._norm(a.q_norm), self._norm(a.k_norm)
            layer.cos, layer.sin = cos.data_ptr(), sin.data_ptr()
        emb_scale = float(torch.tensor(c.hidden_size ** 0.5, dtype=torch.float32)) if self.gemma else 1.0
        self.model = native.Model(
            n_layers=c.num_hidden_layers, dim=c.hidden_size, n_head=c.num_attention_heads,
            n_kv=c.num_key_value_heads, head_dim=c.head_dim, hidden=c.intermediate_size, vocab=c.vocab_size,
            cap=cache.capacity, act=int(self.gemma), n_threads=threads or torch.get_num_threads(),
            eps=c.rms_norm_eps, emb_scale=emb_scale,
            attn_scale=(c.query_pre_attn_scalar if self.gemma else c.head_dim) ** -0.5,
            final_softcap=(getattr(c, "final_logit_softcapping", None) or 0.0),
            embed=model.model.embed_tokens.table.qw(), lm_head=model.lm_head.qw(),
            final_norm=self._norm(model.model.norm), layers=self.layers)
        self.ctx = self.lib.qd_new(ctypes.byref(self.model))
        if not self.ctx:
            raise MemoryError("the CPU step could not allocate its scratch buffers")
        self.logits = torch.empty(c.vocab_size)
        self.owner = model   # the buffers the pointers lead into live as long as the model

    def _norm(self, norm: torch.nn.Module) -> int:
        """An RMSNorm's multiplier as fp32: Gemma's norms scale by 1 + weight."""
        t = norm.weight.detach().float() + (1.0 if self.gemma else 0.0)
        self.keep.append(t.contiguous())
        return self.keep[-1].data_ptr()

    def __call__(self, token: int) -> torch.Tensor:
        """Logits of `token` fed at cache.seqlen; the cache advances by one."""
        c = self.cache
        c.check_fits(1)
        rc = self.lib.qd_step(self.ctx, int(token), c.seqlen, c.k_cache.data_ptr(), c.v_cache.data_ptr(),
                              self.logits.data_ptr())
        if rc != 0:
            raise ValueError(f"token id {token} is outside the vocabulary")
        c.advance(1)
        return self.logits

    def prefill(self, ids: list[int]) -> torch.Tensor:
        """The logits after feeding `ids` one step at a time."""
        for token in ids:
            logits = self(token)
        return logits

    def __del__(self):
        if getattr(self, "ctx", None):
            self.lib.qd_free(self.ctx)
            self.ctx = None
