"""Run the fused Triton decode step in Triton's CPU interpreter against the eager forward.

Started by tests/test_kernels_interpreter.py in a subprocess, because TRITON_INTERPRET must
be set before the kernels are decorated. Prints one JSON line.
"""

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from model.kernels.llama_step import LlamaFusedStep  # noqa: E402
from model.loading import load_model  # noqa: E402


def main(prompts: list[int]) -> None:
    m = load_model("random:tiny").model
    rows = []
    with torch.inference_mode():
        for n in prompts:
            ids = torch.randint(0, 200, (1, n), generator=torch.Generator().manual_seed(n))
            ref_cache, cache = m.new_cache(2048), m.new_cache(2048)
            m(ids, ref_cache)
            m(ids, cache)
            step = LlamaFusedStep(m, cache, pdl=False, splits=4)
            for tok in (7, 11):
                ref = m(torch.tensor([[tok]]), ref_cache)[0, -1]
                step.tok.fill_(tok)
                out = step()[:ref.shape[0]]
                cache.advance(1)
                rows.append(dict(prompt=n, tok=tok, splits=step.decode_attn.splits, block=step.decode_attn.block_n,
                                 rel_err=float((out - ref).norm() / ref.norm()),
                                 argmax_equal=int(out.argmax()) == int(ref.argmax())))
            k = (cache.k_cache[:, :, :cache.pos] - ref_cache.k_cache[:, :, :cache.pos]).abs().max()
            v = (cache.v_cache[:, :, :cache.pos] - ref_cache.v_cache[:, :, :cache.pos]).abs().max()
            rows[-1]["cache_max_diff"] = float(max(k, v))
    print(json.dumps(rows))


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]])
