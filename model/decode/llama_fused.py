"""The Llama-shaped decode step from fused Triton kernels: five launches a layer, overlapped (PDL).

Per layer: norm+QKV(+biases)+rotary+cache write; split-KV attention (or FA3); merge+o_proj+
residual; norm+gate/up+SwiGLU; down+residual. Per-head q/k norms (Qwen3) take a sixth: the
plain QKV product, then `head_norm_rope`. The residual stream lives in one static buffer and
every position comes from `cache_seqlens`, so a CUDA graph of `step()` stays valid for any
position, across turns, rewinds and resets.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvcache import KVCache
from model.decode.decode_attention import DecodeAttention
from model.decode.gemv import ACT_SWIGLU, gemv, norm_gemv, pdl_supported
from model.decode.qkv_rope import head_norm_rope, norm_qkv_rope


def pack_rows(linears: list[torch.nn.Linear]) -> torch.Tensor:
    """Stack the weights of `linears` into one (sum N, K) matrix and point each module at its
    rows, so the eager path and the fused kernels share one copy of the weights."""
    packed = getattr(linears[0], "_packed_rows", None)
    if packed is not None and packed.data_ptr() == linears[0].weight.data_ptr():
        return packed  # packed by an earlier step on this model
    packed = torch.cat([lin.weight.detach() for lin in linears], dim=0).contiguous()
    row = 0
    for lin in linears:
        n = lin.weight.shape[0]
        lin.weight.data = packed[row:row + n]
        row += n
    linears[0]._packed_rows = packed
    return packed


@dataclass
class _Layer:
    ln1: torch.Tensor
    wqkv: torch.Tensor
    wo: torch.Tensor
    ln2: torch.Tensor
    wgu: torch.Tensor
    wdown: torch.Tensor
    bqkv: torch.Tensor | None = None    # Qwen2: q/k/v biases, packed like wqkv's rows
    q_norm: torch.Tensor | None = None  # Qwen3: per-head RMSNorm weights
    k_norm: torch.Tensor | None = None


class LlamaFusedStep:
    """Same contract as TorchStep (torch_step.py): feed `token` at cache_seqlens, write `logits`."""

    def __init__(self, model: torch.nn.Module, cache: KVCache, attn: str = "triton", splits: int = 0,
                 num_splits: int = 1, pdl: bool = True):
        cfg = model.config
        self.model, self.cache, self.cfg = model, cache, cfg
        self.n_head, self.n_kv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.eps = cfg.rms_norm_eps
        dev, dt = cache.device, cache.dtype
        self.layers = [self._layer(layer) for layer in model.model.layers]
        self.cos, self.sin = model.rope(dev)
        self.token = torch.zeros(1, dtype=torch.long, device=dev)
        self.x = torch.zeros(cfg.hidden_size, dtype=dt, device=dev)
        self.q = torch.zeros(self.n_head * self.hd, dtype=dt, device=dev)
        self.qkv = torch.zeros((self.n_head + 2 * self.n_kv) * self.hd, dtype=dt, device=dev)  # q/k-norm path
        self.h = torch.zeros(cfg.intermediate_size, dtype=dt, device=dev)
        self.logits = torch.zeros(cfg.vocab_size, dtype=torch.float32, device=dev)
        self.flash = model.attn.flash if attn == "fa3" else None
        if attn == "fa3" and self.flash is None:
            raise RuntimeError("fused step: attn='fa3' asked for but no flash backend is loaded")
        self.attn_name = self.flash.name if self.flash else "triton"
        self.num_splits = num_splits
        self.decode_attn = DecodeAttention(self.n_head, self.n_kv, self.hd, cache.capacity, dev, splits)
        self.attn_out = torch.zeros(self.n_head * self.hd, dtype=dt, device=dev)
        self.seqlens_k = torch.zeros(1, dtype=torch.int32, device=dev)
        if cache.capacity > self.cos.shape[0]:
            raise ValueError(f"cache capacity {cache.capacity} > rotary table {self.cos.shape[0]}")
        self.pdl = pdl and pdl_supported(dev)
        self.name = f"fused+{self.attn_name}" + ("+pdl" if self.pdl else "")

    @staticmethod
    def _layer(layer) -> _Layer:
        a, mlp = layer.self_attn, layer.mlp
        qkv = [a.q_proj, a.k_proj, a.v_proj]
        bias = torch.cat([lin.bias.detach() for lin in qkv]) if a.q_proj.bias is not None else None
        q_norm, k_norm = getattr(a, "q_norm", None), getattr(a, "k_norm", None)
        if bias is not None and q_norm is not None:
            raise RuntimeError("fused step: q/k/v biases and per-head q/k norms together are not fused")
        return _Layer(layer.input_layernorm.weight, pack_rows(qkv), a.o_proj.weight,
                      layer.post_attention_layernorm.weight, pack_rows([mlp.gate_proj, mlp.up_proj]),
                      mlp.down_proj.weight, bias, q_norm.weight if q_norm is not None else None,
                      k_norm.weight if k_norm is not None else None)

    def _attention(self, i: int, pos: torch.Tensor) -> None:
        kc, vc = self.cache.k_cache[i, 0], self.cache.v_cache[i, 0]
        if self.flash is None:
            out = self.decode_attn(self.q, kc, vc, pos, self.attn_out, pdl=self.pdl)
        else:
            q = self.q.view(1, 1, self.n_head, self.hd)
            out = self.flash.fn(q, kc[None], vc[None], cache_seqlens=self.seqlens_k, causal=True,
                                num_splits=self.num_splits).view(-1)
        gemv(self.layers[i].wo, out, self.x, self.pdl, add=True)

    def __call__(self) -> torch.Tensor:
        m, c = self.model, self.cache
        pos = c.cache_seqlens
        if self.flash is not None:
            torch.add(pos, 1, out=self.seqlens_k)
        torch.index_select(m.model.embed_tokens.weight, 0, self.token, out=self.x.view(1, -1))
        for i, L in enumerate(self.layers):
            kc, vc = c.k_cache[i, 0], c.v_cache[i, 0]
            if L.q_norm is None:
                norm_qkv_rope(self.x, L.ln1, L.wqkv, self.cos, self.sin, pos, self.q, kc, vc,
                              self.n_head, self.n_kv, self.eps, pdl=self.pdl, bias=L.bqkv)
            else:
                norm_gemv(self.x, L.ln1, L.wqkv, self.qkv, self.eps, pdl=self.pdl)
                head_norm_rope(self.qkv, L.q_norm, L.k_norm, self.cos, self.sin, pos, self.q, kc, vc,
                               self.n_head, self.n_kv, self.eps, pdl=self.pdl)
            self._attention(i, pos)
            norm_gemv(self.x, L.ln2, L.wgu, self.h, self.eps, ACT_SWIGLU, self.pdl)
            gemv(L.wdown, self.h, self.x, self.pdl, add=True)
        norm_gemv(self.x, m.model.norm.weight, m.lm_head.weight, self.logits, self.eps, pdl=self.pdl)
        return self.logits
