"""Greedy agreement of the CPU's quantized path with the fp32-dequantized reference, per GGUF.

    python -m chatapp.bench.quant_agreement FILE.gguf [FILE.gguf ...]

For each file: 512 teacher-forced tokens of ordinary prose (tests/data/ordinary_text.txt)
through the C decode step (the CPU default) and, in one forward, through the same file
dequantized exactly to fp32. Prints one line a file: the tensor types it holds, the share of
positions where both pick the same greedy token, and both perplexities. Issue 22's bar: >= 99%.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import torch
from gguf import GGUFReader

TEXT = Path(__file__).resolve().parents[2] / "tests" / "data" / "ordinary_text.txt"


def agreement(path: Path, tokens: int = 512) -> dict:
    from model.cpu.step import CpuStep
    from model.loading import LoadOptions, load_model

    q = load_model(str(path), LoadOptions(quantized=True))
    ref = load_model(str(path), LoadOptions(dtype=torch.float32))
    ids = q.tokenizer.encode(TEXT.read_text())[:tokens + 1]
    with torch.no_grad():
        want = ref.model(torch.tensor([ids[:-1]]), ref.model.new_cache(tokens + 1))[0]
        # one thread: the answer is the same for any count (test_quant's test_threads_agree), and a
        # busy machine makes the step's spinning barriers collapse (issue 24)
        step = CpuStep(q.model, q.model.new_cache(tokens + 1), threads=1)
        got = torch.stack([step(t).clone() for t in ids[:-1]])
    target = torch.tensor(ids[1:])

    def ppl(logits: torch.Tensor) -> float:
        return torch.nn.functional.cross_entropy(logits, target).exp().item()

    types = Counter(t.tensor_type.name for t in GGUFReader(path).tensors if len(t.shape) == 2)
    return {"file": path.name, "types": dict(types), "tokens": len(target),
            "agreement": (got.argmax(-1) == want.argmax(-1)).float().mean().item(),
            "ppl": ppl(got), "ppl_ref": ppl(want)}


def main(argv: list[str]) -> int:
    for name in argv:
        r = agreement(Path(name))
        types = ", ".join(f"{k} x{v}" for k, v in sorted(r["types"].items()))
        print(f"{r['file']}: greedy agreement {r['agreement']:.2%} of {r['tokens']}, perplexity "
              f"{r['ppl']:.3f} vs {r['ppl_ref']:.3f} (fp32 reference); 2-D tensors: {types}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
