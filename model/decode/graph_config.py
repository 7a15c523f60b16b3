"""How the CUDA-graph decode is built: read by graphs.py and by each family's step builder."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass
class GraphConfig:
    fused: bool = True          # Triton kernels; False: the plain PyTorch step inside the graph
    attn: str = "triton"        # decode attention in the fused step: triton (split-KV) or fa3
    splits: int = 0             # split-KV programs per KV head for triton attention; 0: by capacity
    num_splits: int = 1         # FA3's num_splits, pinned: capture and replay must agree
    lookahead: bool = True      # launch the next step before the host has read the sampled token
    pdl: bool = True            # programmatic dependent launch between the fused kernels (Hopper+)
    prefill: bool = True        # prefill through captured graphs at bucketed lengths (model/decode/prefill_graphs.py)
    prefill_bucket: int = 0     # the largest prefill bucket; 0: as memory allows
    prefill_fused: bool = True  # with `fused`: the prefill step's small ops in Triton (decode/prefill_kernels.py)

    @classmethod
    def from_env(cls) -> GraphConfig | None:
        """NANOCHAT_GRAPHS=0 turns graphs off; =torch keeps graphs but not the Triton kernels.
        NANOCHAT_PREFILL_GRAPHS=0 keeps graph decode but prefills eagerly; NANOCHAT_PREFILL_FUSED=0
        captures the prefill from the model's own modules instead of the fused kernels."""
        v = os.environ.get("NANOCHAT_GRAPHS", "1").lower()
        if v in ("0", "off", "eager"):
            return None
        prefill = os.environ.get("NANOCHAT_PREFILL_GRAPHS", "1").lower() not in ("0", "off", "eager")
        fused_prefill = os.environ.get("NANOCHAT_PREFILL_FUSED", "1").lower() not in ("0", "off")
        return cls(fused=v != "torch", attn=os.environ.get("NANOCHAT_DECODE_ATTN", "triton"), prefill=prefill,
                   prefill_fused=fused_prefill)
