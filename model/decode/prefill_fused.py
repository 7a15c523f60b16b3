"""The captured prefill step with fused small kernels (model/decode/prefill_kernels.py): nine launches a layer.

Same contract as `PrefillStep` (model/decode/prefill_step.py): `step()` pushes the bucket's tokens at
`cache_seqlens`, writes K/V there, leaves the cache's position to its caller and writes the
logits of row `last`. The GEMMs are cuBLAS on packed rows (q/k/v, gate/up); attention is the
plain step's `PrefillAttention` (FA3, or the Triton window kernel for windowed layers); the rest
is three Triton kernels, or two where the gate/up GEMM carries the activation (decode/glu_gemm.py,
chosen per bucket by measuring). The residual stream stays one (T, hidden) buffer updated in place, and
each residual add rides in the norm kernel that follows it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from model.decode.glu_gemm import choose, glu_gemm
from model.decode.llama_fused import pack_rows
from model.decode.prefill_kernels import glu, residual_norm, rope_cache
from model.decode.prefill_step import GemmaPrefillStep, LlamaPrefillStep


def fusable(model: torch.nn.Module, family: str | None) -> bool:
    """Llama (no per-head q/k norms) and Gemma 3, bf16 or fp32 weights (not the quantized layers).
    `family`: the model's family name (model/decode/steps.py's family_name)."""
    if family not in ("llama", "gemma3") or not isinstance(model.lm_head, torch.nn.Linear):
        return False
    if family == "llama" and model.config.qk_norm:
        return False
    half = model.config.head_dim // 2
    if half < 1 or half & (half - 1):   # the rotary kernel holds a head's halves as power-of-two blocks
        return False
    projections = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    return all(type(getattr(layer.self_attn, n, None) or getattr(layer.mlp, n, None)) is torch.nn.Linear
               for layer in model.model.layers for n in projections)


def _packed(layer) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    a, mlp = layer.self_attn, layer.mlp
    wqkv = pack_rows([a.q_proj, a.k_proj, a.v_proj])
    bias = None
    if a.q_proj.bias is not None:
        bias = torch.cat([a.q_proj.bias.detach(), a.k_proj.bias.detach(), a.v_proj.bias.detach()])
    return wqkv, bias, pack_rows([mlp.gate_proj, mlp.up_proj])


def mlp_hidden(h: torch.Tensor, wgu: torch.Tensor, cfg: tuple | None, gelu: bool = False) -> torch.Tensor:
    """act(gate) * up of h's rows: the fused GEMM where `choose` measured it faster, else cuBLAS + glu."""
    return glu(F.linear(h, wgu), gelu=gelu) if cfg is None else glu_gemm(h, wgu, gelu, cfg)


class LlamaFusedPrefillStep(LlamaPrefillStep):
    name = "fused"

    def __init__(self, model: torch.nn.Module, *args, **kw):
        super().__init__(model, *args, **kw)
        self.packed = [_packed(layer) for layer in model.model.layers]
        self.glu_cfg = choose(self.ids.shape[1], self.packed[0][2])

    def layers(self, rows: torch.Tensor, rope_rows: torch.Tensor) -> torch.Tensor:
        m, pos, c = self.model, self.cache.cache_seqlens, self.model.config
        cos, sin = m.rope(pos.device)
        x = m.model.embed_tokens(self.ids)[0]   # (B, hidden): the residual stream, updated in place
        layers = m.model.layers
        h = residual_norm(x, None, layers[0].input_layernorm.weight, c.rms_norm_eps)
        for i, layer in enumerate(layers):
            wqkv, bias, wgu = self.packed[i]
            kc, vc = self.cache.get_layer_cache(i)
            q = rope_cache(F.linear(h, wqkv, bias), cos, sin, pos, kc, vc,
                           c.num_attention_heads, c.num_key_value_heads, c.head_dim)
            o = self.attend(q, kc, vc, pos, self.seqlens_k, (-1, -1))
            o = F.linear(o.reshape(x.shape[0], -1), layer.self_attn.o_proj.weight)
            h = residual_norm(x, o, layer.post_attention_layernorm.weight, c.rms_norm_eps)
            d = F.linear(mlp_hidden(h, wgu, self.glu_cfg), layer.mlp.down_proj.weight)
            nxt = layers[i + 1].input_layernorm.weight if i + 1 < len(layers) else None
            h = residual_norm(x, d, nxt, c.rms_norm_eps, h=h if nxt is not None else None)
        return x[None]


class GemmaFusedPrefillStep(GemmaPrefillStep):
    name = "fused"

    def __init__(self, model: torch.nn.Module, *args, **kw):
        super().__init__(model, *args, **kw)
        self.packed = [_packed(layer) for layer in model.model.layers]
        self.glu_cfg = choose(self.ids.shape[1], self.packed[0][2], gelu=True)

    def layers(self, rows: torch.Tensor, rope_rows: torch.Tensor) -> torch.Tensor:
        m, pos, c = self.model, self.cache.cache_seqlens, self.model.config
        tables = m.rope(pos.device)
        x = m.embed(self.ids)[0]
        layers, eps = m.model.layers, c.rms_norm_eps
        h = residual_norm(x, None, layers[0].input_layernorm.weight, eps, gemma=True)
        for i, layer in enumerate(layers):
            a, (wqkv, _, wgu) = layer.self_attn, self.packed[i]
            kc, vc = self.cache.get_layer_cache(i)
            cos, sin = tables[layer.sliding]
            q = rope_cache(F.linear(h, wqkv), cos, sin, pos, kc, vc, a.n_head, a.n_kv, a.hd,
                           a.q_norm.weight, a.k_norm.weight, a.q_norm.eps, a.q_scale)
            o = F.linear(self.attend(q, kc, vc, pos, self.seqlens_k, a.window).reshape(x.shape[0], -1),
                         a.o_proj.weight)
            h = residual_norm(x, o, layer.pre_feedforward_layernorm.weight, eps, h=h,
                              d_norm=layer.post_attention_layernorm.weight, gemma=True)
            d = F.linear(mlp_hidden(h, wgu, self.glu_cfg, gelu=True), layer.mlp.down_proj.weight)
            nxt = layers[i + 1].input_layernorm.weight if i + 1 < len(layers) else None
            h = residual_norm(x, d, nxt, eps, h=h if nxt is not None else None,
                              d_norm=layer.post_feedforward_layernorm.weight, gemma=True)
        return x[None]


def fused_prefill_class(model: torch.nn.Module, family: str | None) -> type | None:
    if not fusable(model, family):
        return None
    return GemmaFusedPrefillStep if family == "gemma3" else LlamaFusedPrefillStep
