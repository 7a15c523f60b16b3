"""nanochat's decode step in plain PyTorch, with the position read from the device.

Every generation's extras (value embeddings, lambdas, smear, backout, windows, softcap)
go through the model's own modules, as in `Nanochat.forward`; only the host-side position
is replaced by `cache_seqlens`, so a CUDA graph of this step is valid at any position.
"""

from __future__ import annotations

import torch

from kvcache import KVCache
from model.families.layers import StepAttention, apply_rotary, rms_norm
from model.families.nanochat import TOKENS_STATE, Nanochat


class NanochatTorchStep:
    """Feed `tok` at cache_seqlens and write `logits`; the caller advances the cache."""

    name = "torch"

    def __init__(self, model: Nanochat, cache: KVCache, num_splits: int = 1):
        self.model, self.cache, self.cfg = model, cache, model.config
        dev = cache.device
        self.tok = torch.zeros(1, dtype=torch.long, device=dev)
        self.logits = torch.zeros(self.cfg.vocab_size, dtype=torch.float32, device=dev)
        self.windows = [model.window(i, cache) for i in range(self.cfg.n_layer)]
        self.attend = StepAttention(model.attn, cache, num_splits)
        self.attn_name = self.attend.name
        self.rope = model.rope(cache.capacity, dev, cache.dtype)  # long enough for any position

    def _attention(self, i: int, x, ve, cos, sin, pos, posl) -> torch.Tensor:
        a, cfg, hd = self.model.transformer.h[i].attn, self.cfg, self.cfg.head_dim
        q = a.c_q(x).view(1, 1, cfg.n_head, hd)
        k = a.c_k(x).view(1, 1, cfg.n_kv_head, hd)
        v = a.c_v(x).view(1, 1, cfg.n_kv_head, hd)
        if ve is not None:
            gate = cfg.ve_gate_scale * torch.sigmoid(a.ve_gate(x[..., :cfg.ve_gate_channels]))
            v = v + gate.unsqueeze(-1) * ve.view(1, 1, cfg.n_kv_head, hd)
        q, k = rms_norm(apply_rotary(q, cos, sin)), rms_norm(apply_rotary(k, cos, sin))
        if cfg.qk_scale != 1.0:
            q, k = q * cfg.qk_scale, k * cfg.qk_scale
        kc, vc = self.cache.get_layer_cache(i)
        kc.index_copy_(1, posl, k)
        vc.index_copy_(1, posl, v)
        return a.c_proj(self.attend(q, kc, vc, pos, self.windows[i]).reshape(1, 1, -1))

    def _smear(self, idx, x, pos, posl) -> torch.Tensor:
        m, c = self.model, self.cfg.smear_channels
        ids = self.cache.state[TOKENS_STATE]
        ids.index_copy_(1, posl, idx)
        prev = rms_norm(m.transformer.wte(ids.index_select(1, (posl - 1).clamp(min=0))))
        gate = m.smear_lambda.to(x.dtype) * torch.sigmoid(m.smear_gate(x[..., :c]))
        return torch.where(pos > 0, x + gate * prev, x)  # the very first token has no previous one

    def __call__(self) -> torch.Tensor:
        m, cfg, c = self.model, self.cfg, self.cache
        pos = c.cache_seqlens
        posl = pos.long()
        self.attend.start(pos)
        idx = self.tok.view(1, 1)
        x = rms_norm(m.transformer.wte(idx))
        cos, sin = self.rope[0].index_select(0, posl), self.rope[1].index_select(0, posl)
        if cfg.smear_channels:
            x = self._smear(idx, x, pos, posl)
        x0, x_backout = x, None
        for i, block in enumerate(m.transformer.h):
            if cfg.lambdas:
                x = m.resid_lambdas[i] * x + m.x0_lambdas[i] * x0
            ve = m.value_embeds[str(i)](idx) if str(i) in m.value_embeds else None
            x = x + self._attention(i, rms_norm(x), ve, cos, sin, pos, posl)
            x = x + block.mlp(rms_norm(x))
            if cfg.backout and i == cfg.n_layer // 2:
                x_backout = x
        if x_backout is not None:
            x = x - m.backout_lambda.to(x.dtype) * x_backout
        logits = m.lm_head(rms_norm(x))[0, 0, :cfg.vocab_size].float()
        self.logits.copy_(cfg.softcap * torch.tanh(logits / cfg.softcap))
        return self.logits
