"""nanochat's architecture generations: the config of a checkpoint and the constants of its time.

nanochat's gpt.py changed constants in place over its history (RoPE base, q/k scale, gate
scales, window sizes), so a checkpoint only runs right with the constants of the commit
that trained it. docs/nanochat.md lists the commits each generation is taken from.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

# Named by the date of the nanochat commit that introduced them; each after the first says only
# what changed from the one before it.
_INITIAL = dict(rope_base=10000.0, rope_bf16=True, qk_scale=1.0, softcap=15.0, lambdas=False,
                sliding_windows=False, short_window="half", ve_gate_channels=0, ve_gate_scale=2.0,
                smear_channels=0, backout=False)
_JAN = _INITIAL | dict(lambdas=True, sliding_windows=True, ve_gate_channels=32)
_MAR09 = _JAN | dict(rope_base=100000.0, rope_bf16=False, qk_scale=1.15, short_window="third128",
                     ve_gate_channels=12, ve_gate_scale=3.0)
GENERATIONS: dict[str, dict] = {
    "2025-10": _INITIAL,                      # 3a5e0bc (2025-10-13): the initial GPT, plain causal attention
    "2026-01": _JAN,                          # aa530cd, fbc1484, e85db6b (2026-01-11..16): lambdas,
                                              # window_pattern, value embeddings
    "2026-03-02": _JAN | dict(softcap=20.0),  # aba30cb (2026-03-02): softcap 20 for one week
    "2026-03-09": _MAR09,                     # 6ed7d1d (2026-03-09): autoresearch round 1
    "2026-03-14": _MAR09 | dict(qk_scale=1.2, short_window="quarter128", smear_channels=24,
                                backout=True),  # a825e63 (2026-03-14) to HEAD: round 2, smear and backout
}
LATEST = "2026-03-14"


@dataclass
class NanochatConfig:
    # Shapes, as nanochat's GPTConfig stores them in meta_*.json ("model_config").
    sequence_len: int = 2048
    vocab_size: int = 32768
    n_layer: int = 12
    n_head: int = 6
    n_kv_head: int = 6
    n_embd: int = 768
    window_pattern: str = "L"           # tiled over layers, last layer always L; missing means "L"
    padded_vocab_size: int | None = None  # rows of wte: padded to 64 since 2025-12-09 (f1bf69d)
    # The generation's constants (defaults: the latest); see GENERATIONS.
    generation: str = LATEST
    rope_base: float = 100000.0
    rope_bf16: bool = False             # rotary tables kept in bf16 even in fp32 (before 2026-03-04)
    qk_scale: float = 1.2               # q and k multiplied after QK-norm
    softcap: float = 15.0               # logits squashed to (-softcap, softcap)
    lambdas: bool = True                # per-layer resid_lambdas / x0_lambdas
    sliding_windows: bool = True        # False: plain causal attention at any length
    short_window: str = "quarter128"    # how "S" is derived from sequence_len
    ve_gate_channels: int = 12          # 0: no value embeddings
    ve_gate_scale: float = 3.0          # value-embedding gate = scale * sigmoid(...)
    smear_channels: int = 24            # 0: no smear gate over the previous token
    backout: bool = True                # subtract the n_layer//2 residual before the final norm

    def __post_init__(self):
        if self.padded_vocab_size is None:
            self.padded_vocab_size = self.vocab_size

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_dim(self) -> int:
        return self.n_kv_head * self.head_dim

    def has_ve(self, layer: int) -> bool:
        """Value embeddings sit on alternating layers, the last one always included."""
        return self.ve_gate_channels > 0 and layer % 2 == (self.n_layer - 1) % 2

    def window_lefts(self) -> list[int]:
        """Per layer, how many earlier tokens a query sees (-1: all of them)."""
        if not self.sliding_windows:
            return [-1] * self.n_layer
        long = self.sequence_len
        short = {"half": long // 2,
                 "third128": -(-long // 3 // 128) * 128,
                 "quarter128": -(-long // 4 // 128) * 128}[self.short_window]
        pattern = self.window_pattern.upper()
        lefts = [short if pattern[i % len(pattern)] == "S" else long for i in range(self.n_layer)]
        lefts[-1] = long
        return lefts

    def validate(self) -> None:
        """Raise ValueError (with the field's name) for a config no model can be built from."""
        if self.generation not in GENERATIONS:
            raise ValueError(f"unknown generation {self.generation!r} (known: {', '.join(GENERATIONS)})")
        if self.short_window not in ("half", "third128", "quarter128"):
            raise ValueError(f"short_window must be half, third128 or quarter128, not {self.short_window!r}")
        if not self.window_pattern or any(c not in "SLsl" for c in self.window_pattern):
            raise ValueError(f"window_pattern must use only S and L, not {self.window_pattern!r}")
        if min(self.n_layer, self.n_head, self.n_kv_head, self.n_embd, self.vocab_size, self.sequence_len) <= 0:
            raise ValueError("n_layer, n_head, n_kv_head, n_embd, vocab_size and sequence_len must be positive")
        for name in ("rope_base", "qk_scale", "softcap", "ve_gate_scale"):
            if not math.isfinite(v := getattr(self, name)) or v <= 0:  # NaN here turns every logit into NaN
                raise ValueError(f"{name} must be a positive number, not {v!r}")
        if self.n_embd % self.n_head or self.n_head % self.n_kv_head or self.head_dim % 2:
            raise ValueError(f"n_embd {self.n_embd}, n_head {self.n_head}, n_kv_head {self.n_kv_head}: "
                             "heads must divide evenly into an even head size")
        if self.padded_vocab_size < self.vocab_size:
            raise ValueError(f"padded_vocab_size {self.padded_vocab_size} < vocab_size {self.vocab_size}")
        for name, channels in (("ve_gate_channels", self.ve_gate_channels),
                               ("smear_channels", self.smear_channels)):
            if not 0 <= channels <= self.n_embd:
                raise ValueError(f"{name} {channels} must be between 0 and n_embd {self.n_embd}")

    @classmethod
    def for_generation(cls, generation: str, **fields) -> NanochatConfig:
        """A config with `generation`'s constants; `fields` (shapes, overrides) win."""
        if generation not in GENERATIONS:
            raise ValueError(f"unknown generation {generation!r} (known: {', '.join(GENERATIONS)})")
        return cls(**{**GENERATIONS[generation], "generation": generation, **fields})


FIELDS = {f.name: f.type for f in dataclasses.fields(NanochatConfig)}
