"""Gemma 3's decode step from the Llama step's fused Triton kernels, plus two small ones.

Per layer, five kernels: [previous layer's post-feedforward norm + residual] + norm + QKV
(`norm_gemv`, the norm's `1 + w` folded into an fp32 weight); per-head q/k norm + rotary (its
layer type's table) + cache write (`head_norm_rope`); attention (a windowed layer's split-KV
kernel reads its last W keys in place; FA3 builds without local attention read a gathered copy);
o_proj; post-attention norm + residual + norm + gate/up + GeGLU; down. The post-norms need the
whole sublayer output, so they ride at the head of the next `norm_gemv`, every program redoing
the 640-wide norm and the first one storing the new residual into the other of two buffers.
The kernels round where the Llama step does, so this differs from the eager module (which
rounds Gemma's norms once, at the end) by bf16 noise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kvcache import KVCache
from model.decode.decode_attention import DecodeAttention
from model.decode.gemv import ACT_GEGLU, gemv, norm_gemv, pdl_supported
from model.decode.llama_fused import pack_rows
from model.decode.qkv_rope import head_norm_rope


@triton.jit
def _post_norm_add_kernel(t_ptr, w_ptr, x_ptr, eps, K: tl.constexpr, KP: tl.constexpr, PDL: tl.constexpr):
    """x += (RMSNorm(t) * (1 + w)) in fp32, rounded once, then added as `x + norm(t)` is."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    cols = tl.arange(0, KP)
    m = cols < K
    w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
    if PDL:
        tl.extra.cuda.gdc_wait()
    t = tl.load(t_ptr + cols, mask=m, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(t * t, 0) / K + eps)
    x = tl.load(x_ptr + cols, mask=m, other=0.0)
    y = (t * rstd * (1.0 + w)).to(x.dtype).to(tl.float32)
    tl.store(x_ptr + cols, (x.to(tl.float32) + y).to(x.dtype), mask=m)


def post_norm_add(t: torch.Tensor, w: torch.Tensor, x: torch.Tensor, eps: float, pdl: bool) -> None:
    k = x.shape[-1]
    _post_norm_add_kernel[(1,)](t, w, x, eps, K=k, KP=triton.next_power_of_2(k), PDL=pdl, num_warps=4,
                                launch_pdl=pdl)


@dataclass
class _Layer:
    sliding: bool
    ln_in: torch.Tensor     # 1 + w, fp32: the norms the GEMV kernels fold in
    wqkv: torch.Tensor
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    wo: torch.Tensor
    ln_post_attn: torch.Tensor  # raw w: post_norm_add adds the 1
    ln_pre_ffw: torch.Tensor
    wgu: torch.Tensor
    wdown: torch.Tensor
    ln_post_ffw: torch.Tensor


def one_plus(w: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    return ((1.0 + w.detach().float()) * scale).contiguous()


class GemmaFusedStep:
    """Same contract as TorchStep (torch_step.py): feed `token` at cache_seqlens, write `logits`."""

    def __init__(self, model: torch.nn.Module, cache: KVCache, attn: str = "triton", splits: int = 0,
                 num_splits: int = 1, pdl: bool = True, win_splits: int = 0, head_add: bool = False,
                 head_block: tuple[int, int] = (0, 0)):
        c = model.config
        self.model, self.cache, self.cfg = model, cache, c
        self.n_head, self.n_kv, self.hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.eps = c.rms_norm_eps
        dev, dt = cache.device, cache.dtype
        qs = model.model.layers[0].self_attn.q_scale   # folded into the q norm's weight
        self.layers = [_Layer(layer.sliding, one_plus(layer.input_layernorm.weight),
                              pack_rows([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj]),
                              one_plus(layer.self_attn.q_norm.weight, qs), one_plus(layer.self_attn.k_norm.weight),
                              layer.self_attn.o_proj.weight, layer.post_attention_layernorm.weight.detach().float(),
                              one_plus(layer.pre_feedforward_layernorm.weight),
                              pack_rows([layer.mlp.gate_proj, layer.mlp.up_proj]), layer.mlp.down_proj.weight,
                              layer.post_feedforward_layernorm.weight.detach().float())
                       for layer in model.model.layers]
        self.final_norm = one_plus(model.model.norm.weight)
        self.rope = model.rope(dev)
        if cache.capacity > self.rope[True][0].shape[0]:
            raise ValueError(f"cache capacity {cache.capacity} > rotary table {self.rope[True][0].shape[0]}")
        self.emb_scale = float(torch.tensor(c.hidden_size ** 0.5, dtype=dt))
        self.token = torch.zeros(1, dtype=torch.long, device=dev)
        self.x = torch.zeros(c.hidden_size, dtype=dt, device=dev)
        self.x2 = torch.zeros_like(self.x)    # the residual alternates between x and x2
        self.t = torch.zeros(c.hidden_size, dtype=dt, device=dev)
        self.qkv = torch.zeros((self.n_head + 2 * self.n_kv) * self.hd, dtype=dt, device=dev)
        self.q = torch.zeros(self.n_head * self.hd, dtype=dt, device=dev)
        self.h = torch.zeros(c.intermediate_size, dtype=dt, device=dev)
        self.attn_out = torch.zeros(self.n_head * self.hd, dtype=dt, device=dev)
        self.logits = torch.zeros(c.vocab_size, dtype=torch.float32, device=dev)
        self.W = min(c.sliding_window, cache.capacity)
        self.win_base = torch.arange(self.W, device=dev)
        self.win_idx = torch.zeros(self.W, dtype=torch.long, device=dev)
        self.win_pos = torch.zeros(1, dtype=torch.int32, device=dev)      # the query's place in the window
        self.kwin = torch.zeros(self.W, self.n_kv, self.hd, dtype=dt, device=dev)
        self.vwin = torch.zeros_like(self.kwin)
        self.flash = model.attn.flash if attn == "fa3" else None
        if attn == "fa3" and self.flash is None:
            raise RuntimeError("fused step: attn='fa3' asked for but no flash backend is loaded")
        self.num_splits = num_splits
        self.seqlens_full = torch.zeros(1, dtype=torch.int32, device=dev)
        self.seqlens_win = torch.zeros(1, dtype=torch.int32, device=dev)
        self.attn_full = DecodeAttention(self.n_head, self.n_kv, self.hd, cache.capacity, dev, splits)
        # the split-KV kernel reads a window in place; FA3 (no local attention here) a gathered copy
        self.attn_win = DecodeAttention(self.n_head, self.n_kv, self.hd, self.W, dev, win_splits or splits,
                                        window=self.W)
        self.head_add, self.head_block = head_add, head_block
        self.attn_name = self.flash.name if self.flash else "triton"
        self.pdl = pdl and pdl_supported(dev)
        self.name = f"fused+{self.attn_name}" + ("+pdl" if self.pdl else "")

    def _attend(self, i: int, sliding: bool, pos: torch.Tensor) -> torch.Tensor:
        kc, vc = self.cache.k_cache[i, 0], self.cache.v_cache[i, 0]
        if self.flash is None:
            return (self.attn_win if sliding else self.attn_full)(self.q, kc, vc, pos, self.attn_out, pdl=self.pdl)
        if sliding:  # the window's W keys (clamped at the start), copied in order
            torch.index_select(kc, 0, self.win_idx, out=self.kwin)
            torch.index_select(vc, 0, self.win_idx, out=self.vwin)
            kc, vc = self.kwin, self.vwin
        q = self.q.view(1, 1, self.n_head, self.hd)
        return self.flash.fn(q, kc[None], vc[None], cache_seqlens=self.seqlens_win if sliding else self.seqlens_full,
                             causal=True, num_splits=self.num_splits).view(-1)

    def __call__(self) -> torch.Tensor:
        m, c = self.model, self.cache
        pos = c.cache_seqlens
        # window bookkeeping, once a step: keys [max(0, pos+1-W), ...], the query at min(pos, W-1)
        if self.flash is not None:
            start = (pos.long() + 1 - self.W).clamp_(min=0)
            torch.add(self.win_base, start, out=self.win_idx)
            torch.clamp(pos, max=self.W - 1, out=self.win_pos)
            torch.add(pos, 1, out=self.seqlens_full)
            torch.add(self.win_pos, 1, out=self.seqlens_win)
        x, x_next = self.x, self.x2
        torch.index_select(m.model.embed_tokens.weight, 0, self.token, out=x.view(1, -1))
        x.mul_(self.emb_scale)
        post = None   # the post-norm weight still to apply to self.t before x is the residual
        for i, L in enumerate(self.layers):
            kc, vc = c.k_cache[i, 0], c.v_cache[i, 0]
            cos, sin = self.rope[L.sliding]
            norm_gemv(x, L.ln_in, L.wqkv, self.qkv, self.eps, pdl=self.pdl,
                      add=None if post is None else (self.t, post, x_next))
            if post is not None:
                x, x_next = x_next, x
            head_norm_rope(self.qkv, L.q_norm, L.k_norm, cos, sin, pos, self.q, kc, vc,
                           self.n_head, self.n_kv, self.eps, pdl=self.pdl)
            out = self._attend(i, L.sliding, pos)
            gemv(L.wo, out, self.t, self.pdl)
            norm_gemv(x, L.ln_pre_ffw, L.wgu, self.h, self.eps, ACT_GEGLU, self.pdl,
                      add=(self.t, L.ln_post_attn, x_next))
            x, x_next = x_next, x
            gemv(L.wdown, self.h, self.t, self.pdl)
            post = L.ln_post_ffw
        bn, warps = self.head_block
        if self.head_add:
            norm_gemv(x, self.final_norm, m.lm_head.weight, self.logits, self.eps, pdl=self.pdl,
                      add=(self.t, post, x_next), block_n=bn, warps=warps)
        else:
            post_norm_add(self.t, post, x, self.eps, self.pdl)
            norm_gemv(x, self.final_norm, m.lm_head.weight, self.logits, self.eps, pdl=self.pdl,
                      block_n=bn, warps=warps)
        cap = self.cfg.final_logit_softcapping
        if cap:
            self.logits.div_(cap).tanh_().mul_(cap)
        return self.logits
