"""The prefill GEMM's rounded activations against the fp32 reference, on a real model.

    python -m chatapp.bench.prefill_agreement FILE.gguf [FILE.gguf ...]
    NANOCHAT_QGEMM=int8 python -m chatapp.bench.prefill_agreement ...   # int8 activations
    NANOCHAT_QGEMM=1 python -m chatapp.bench.prefill_agreement ...      # int16 (the default without bf16)

For each file: 512 teacher-forced tokens of ordinary prose (tests/data/ordinary_text.txt) in
one prefill through the CPU's default path, whose layers run the integer GEMM (qgemm.c) or, where
the CPU has AMX or AVX-512 BF16, the bf16 one (qgemm_bf16.c), and
in one forward through the same file dequantized exactly to fp32. Every position's logits
come from the head's int16 row kernel, as the last position's do in the app (`GEMM head` also
reports the head through the GEMM). Prints the share of positions where both pick the same
greedy token, both perplexities and the largest logit difference.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

TEXT = Path(__file__).resolve().parents[2] / "tests" / "data" / "ordinary_text.txt"


def agreement(path: Path, tokens: int = 512) -> dict:
    from model.cpu import prefill_gemm
    from model.loading import LoadOptions, load_model

    if not prefill_gemm.enabled():
        raise SystemExit("the prefill GEMM is off here (no AVX-512 VNNI or AMX; NANOCHAT_QGEMM=1 forces it)")
    q = load_model(str(path), LoadOptions(quantized=True))
    ref = load_model(str(path), LoadOptions(dtype=torch.float32))
    ids = q.tokenizer.encode(TEXT.read_text())[:tokens + 1]
    seen: list[torch.Tensor] = []
    hook = q.model.lm_head.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach().clone()))
    with torch.no_grad():
        want = ref.model(torch.tensor([ids[:-1]]), ref.model.new_cache(tokens + 1))[0]
        head8 = q.model(torch.tensor([ids[:-1]]), q.model.new_cache(tokens + 1))[0]
        hook.remove()
        hidden = seen[0][0]
        got = torch.stack([q.model.lm_head(h) for h in hidden])   # one row at a time: the int16 kernel
        if cap := getattr(q.model.config, "final_logit_softcapping", None):   # Gemma's head
            got = cap * torch.tanh(got / cap)
    target = torch.tensor(ids[1:])

    def ppl(logits: torch.Tensor) -> float:
        return torch.nn.functional.cross_entropy(logits, target).exp().item()

    def agree(logits: torch.Tensor) -> float:
        return (logits.argmax(-1) == want.argmax(-1)).float().mean().item()

    how = prefill_gemm.path(tokens)
    return {"file": path.name, "activations": how if how == "bf16" else f"int{prefill_gemm.activation_bits()}",
            "tokens": len(target),
            "agreement": agree(got), "agreement_gemm_head": agree(head8),
            "ppl": ppl(got), "ppl_gemm_head": ppl(head8), "ppl_ref": ppl(want),
            "max_logit_diff": (got - want).abs().max().item(), "max_logit": want.abs().max().item()}


def main(argv: list[str]) -> int:
    for name in argv:
        r = agreement(Path(name))
        print(f"{r['file']}, {r['activations']} activations: greedy agreement {r['agreement']:.2%} of {r['tokens']} "
              f"(GEMM head: {r['agreement_gemm_head']:.2%}), perplexity {r['ppl']:.3f} (GEMM head "
              f"{r['ppl_gemm_head']:.3f}) vs "
              f"{r['ppl_ref']:.3f} (fp32 reference); largest logit difference {r['max_logit_diff']:.3f} "
              f"(largest logit {r['max_logit']:.2f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
