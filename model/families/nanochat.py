"""nanochat's GPT, every generation of it, over our persistent KVCache.

Module names mirror nanochat's gpt.py so its checkpoints load with no renaming. The
constants that changed over nanochat's history live in NanochatConfig (nanochat_config.py).

Unlike nanochat's own inference path, a multi-token chunk prefilled on top of a non-empty
cache gets the smear gate right: the previous token is kept in the cache, by position.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from kvcache import Attention, KVCache
from model.families.declare import RandomWeights
from model.families.layers import ReLU2, apply_rotary, rms_norm, rope_rows, rotary_tables
from model.families.nanochat_config import GENERATIONS, LATEST, NanochatConfig

TOKENS_STATE = "nanochat.token_ids"  # per-position token ids: the smear gate's previous token


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: NanochatConfig, layer: int):
        super().__init__()
        self.layer, self.cfg = layer, cfg
        hd = cfg.head_dim
        self.c_q = nn.Linear(cfg.n_embd, cfg.n_head * hd, bias=False)
        self.c_k = nn.Linear(cfg.n_embd, cfg.n_kv_head * hd, bias=False)
        self.c_v = nn.Linear(cfg.n_embd, cfg.n_kv_head * hd, bias=False)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)
        self.ve_gate = nn.Linear(cfg.ve_gate_channels, cfg.n_kv_head, bias=False) if cfg.has_ve(layer) else None

    def forward(self, x, ve, cos, sin, window: tuple[int, int], cache: KVCache, attn: Attention):
        b, t, _ = x.shape
        cfg, hd = self.cfg, self.cfg.head_dim
        q = self.c_q(x).view(b, t, cfg.n_head, hd)
        k = self.c_k(x).view(b, t, cfg.n_kv_head, hd)
        v = self.c_v(x).view(b, t, cfg.n_kv_head, hd)
        if ve is not None:  # value residual, gated per head by the first channels of x
            gate = cfg.ve_gate_scale * torch.sigmoid(self.ve_gate(x[..., :cfg.ve_gate_channels]))
            v = v + gate.unsqueeze(-1) * ve.view(b, t, cfg.n_kv_head, hd)
        q, k = rms_norm(apply_rotary(q, cos, sin)), rms_norm(apply_rotary(k, cos, sin))
        if cfg.qk_scale != 1.0:
            q, k = q * cfg.qk_scale, k * cfg.qk_scale
        y = attn(q, k, v, cache, self.layer, causal=True, window_size=window)
        return self.c_proj(y.reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, cfg: NanochatConfig, layer: int):
        super().__init__()
        self.attn = CausalSelfAttention(cfg, layer)
        self.mlp = ReLU2(cfg.n_embd, 4 * cfg.n_embd)

    def forward(self, x, ve, cos, sin, window, cache: KVCache, attn: Attention) -> torch.Tensor:
        x = x + self.attn(rms_norm(x), ve, cos, sin, window, cache, attn)
        return x + self.mlp(rms_norm(x))


class Nanochat(nn.Module):
    """`forward(idx (1, T), cache) -> fp32 logits (1, T, vocab_size)` for the new tokens."""

    def __init__(self, cfg: NanochatConfig, attn: Attention | None = None):
        super().__init__()
        cfg.validate()
        self.config = cfg
        self.attn = attn or Attention("auto")
        self.max_seq_len = cfg.sequence_len
        vocab = cfg.padded_vocab_size
        self.transformer = nn.ModuleDict({
            "wte": nn.Embedding(vocab, cfg.n_embd),
            "h": nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layer)),
        })
        self.lm_head = nn.Linear(cfg.n_embd, vocab, bias=False)
        if cfg.lambdas:
            self.resid_lambdas = nn.Parameter(torch.ones(cfg.n_layer))
            self.x0_lambdas = nn.Parameter(torch.zeros(cfg.n_layer))
        if cfg.smear_channels:
            self.smear_gate = nn.Linear(cfg.smear_channels, 1, bias=False)
            self.smear_lambda = nn.Parameter(torch.zeros(1))
        if cfg.backout:
            self.backout_lambda = nn.Parameter(torch.zeros(1))
        self.value_embeds = nn.ModuleDict({str(i): nn.Embedding(vocab, cfg.kv_dim)
                                           for i in range(cfg.n_layer) if cfg.has_ve(i)})
        self.window_lefts = cfg.window_lefts()
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None
        self.retired: list = []  # tables replaced by new ones, kept alive for graphs captured on them

    def new_cache(self, seq_len: int | None = None) -> KVCache:
        cfg, p = self.config, self.lm_head.weight
        cache = KVCache(1, cfg.n_kv_head, seq_len or self.max_seq_len, cfg.head_dim, cfg.n_layer,
                        p.device, p.dtype)
        if cfg.smear_channels:
            cache.add_state(TOKENS_STATE, (), torch.long)
        return cache

    def rope(self, length: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        r = self._rope
        if r is None or r[0].shape[0] < length or r[0].device != device or r[0].dtype != dtype:
            # Like nanochat, well past the training length, so a long cache never runs out.
            cfg = self.config
            size = max(length, 10 * cfg.sequence_len)
            # fp32 angles, as nanochat computes them; its checkpoints rotate by -angle
            cos, sin = rotary_tables(cfg.head_dim, size, cfg.rope_base, torch.float32, device, reverse=True)
            if cfg.rope_bf16:  # older generations stored the tables in bf16 whatever the compute dtype
                cos, sin = cos.bfloat16(), sin.bfloat16()
            self.retired += [r] if r is not None else []  # a captured CUDA graph may read them
            self._rope = r = cos.to(dtype), sin.to(dtype)
        return r

    def window(self, layer: int, cache: KVCache) -> tuple[int, int]:
        left = self.window_lefts[layer]
        # A window at least as long as the cache is no window; saying so keeps flash kernels
        # that lack local attention on the fast path.
        return (-1, -1) if left < 0 or left >= cache.capacity - 1 else (left, 0)

    def smear(self, idx: torch.Tensor, x: torch.Tensor, cache: KVCache, pos: int, step=None) -> torch.Tensor:
        """Mix each token's previous token embedding into it; the first token of all has none."""
        ids = cache.state[TOKENS_STATE]
        if step is not None:
            return self.smear_step(idx, x, ids, step)
        ids[:, pos:pos + idx.shape[1]] = idx
        if pos == 0 and idx.shape[1] == 1:
            return x
        if pos == 0:
            prev, cur = x[:, :-1], x[:, 1:]
        else:  # the token before this chunk lives in the cache: recompute its embedding
            first = rms_norm(self.transformer.wte(ids[:, pos - 1:pos]))
            prev, cur = torch.cat([first, x[:, :-1]], dim=1), x
        c = self.config.smear_channels
        gate = self.smear_lambda.to(x.dtype) * torch.sigmoid(self.smear_gate(cur[..., :c]))
        cur = cur + gate * prev
        return torch.cat([x[:, :1], cur], dim=1) if pos == 0 else cur

    def smear_step(self, idx: torch.Tensor, x: torch.Tensor, ids: torch.Tensor, step) -> torch.Tensor:
        """`smear` of one token at the device position: the branch on it is a `where`."""
        ids.index_copy_(1, step.seqlens_long, idx)
        prev = rms_norm(self.transformer.wte(ids.index_select(1, (step.seqlens_long - 1).clamp(min=0))))
        gate = self.smear_lambda.to(x.dtype) * torch.sigmoid(self.smear_gate(x[..., :self.config.smear_channels]))
        return torch.where(step.cache_seqlens > 0, x + gate * prev, x)  # the very first token has no previous one

    def forward(self, idx: torch.Tensor, cache: KVCache, last: bool = False, step=None) -> torch.Tensor:
        """`last`: only the last position's logits (a prefill needs no others). `step`: one token
        at the device position, the cache not advanced (the capturable decode step,
        model/decode/torch_step.py)."""
        cfg, t = self.config, idx.shape[1]
        if step is None:
            cache.check_fits(t)  # before anything is written: an overflow leaves the cache as it was
        pos = cache.seqlen
        x = rms_norm(self.transformer.wte(idx))
        # a step's tables cover the whole cache, so no position it reaches can outgrow them
        cos, sin = rope_rows(*self.rope(cache.capacity if step else pos + t, idx.device, x.dtype), cache, t, step)
        if cfg.smear_channels:
            x = self.smear(idx, x, cache, pos, step)
        x0, x_backout = x, None
        for i, block in enumerate(self.transformer.h):
            if cfg.lambdas:
                x = self.resid_lambdas[i] * x + self.x0_lambdas[i] * x0
            ve = self.value_embeds[str(i)](idx) if str(i) in self.value_embeds else None
            x = block(x, ve, cos, sin, self.window(i, cache), cache, step or self.attn)
            if cfg.backout and i == cfg.n_layer // 2:
                x_backout = x
        if x_backout is not None:
            x = x - self.backout_lambda.to(x.dtype) * x_backout
        if last:
            x = x[:, -1:]
        logits = self.lm_head(rms_norm(x))[..., :cfg.vocab_size].float()
        if step is None:
            cache.advance(t)
        return cfg.softcap * torch.tanh(logits / cfg.softcap)


def init_random(model: Nanochat) -> None:
    """The lambdas as built (they weigh the residual stream); the embeddings and head smaller."""
    for name, p in model.named_parameters():
        if "lambda" not in name:
            p.normal_(0.0, 0.02 if p.dim() == 2 and p.shape[0] >= model.config.vocab_size else 0.04)


# nanochat's d20 and d32 shapes, the newest generation's architecture (`random:d20` is a Llama of that size).
RANDOM = RandomWeights(init=init_random, presets={
    f"nanochat-{name}": {**GENERATIONS[LATEST], "generation": LATEST, "sequence_len": 8192, "vocab_size": 32768,
                         **shape}
    for name, shape in (("d20", dict(n_layer=20, n_head=10, n_kv_head=10, n_embd=1280)),
                        ("d32", dict(n_layer=32, n_head=16, n_kv_head=16, n_embd=2048)))})
