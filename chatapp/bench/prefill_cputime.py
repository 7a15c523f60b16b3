"""Prefill cost in CPU time, ours against llama.cpp, one thread each, alternating.

`python -m chatapp.bench.prefill_cputime FILE.gguf [--pp 512] [--rounds 3] [--llama-bench PATH]`

The prefill's twin of cputime.py (which times decode): on a shared machine the wall-clock pp512
moves with the other programs, the CPU a prefill costs on one thread much less.

- ours: `time.process_time` around the app's Generator prefilling `--pp` random tokens into an
  empty cache, one thread; the best of three in each round (a warm-up prefill first);
- llama.cpp: llama-bench `-t 1 -p PP -n 0`, run with `-r 4` and `-r 1`; the child's user + system
  CPU time of the difference over 3 is one prefill, loading and warm-up cancelled out.

Prints a row per round, then the medians and llama.cpp / ours (above 1: ours costs less).
"""

from __future__ import annotations

import statistics
import time

import torch

from chatapp.bench.cputime import _child_cpu, one_thread_model, parser
from chatapp.bench.llamacpp import find_binary
from model.decode.generate import Generator


def ours_ms(gen: Generator, pp: int, seed: int) -> float:
    """CPU ms of one prefill of `pp` tokens into an empty cache."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, min(gen.vocab_size, 30000), (pp,), generator=g).tolist()
    gen.cache.reset()
    gen.forget()
    t = time.process_time()
    gen.prefill(ids)
    return (time.process_time() - t) * 1e3


def llama_ms(binary: str, gguf: str, pp: int) -> float:
    def run(reps: int) -> float:
        return _child_cpu([binary, "-m", gguf, "-t", "1", "-p", str(pp), "-n", "0", "-r", str(reps), "-o", "json"])
    return (run(4) - run(1)) / 3 * 1e3


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__)
    ap.add_argument("--pp", type=int, default=512)
    args = ap.parse_args(argv)
    binary, why = find_binary(args.llama_bench)
    lm = one_thread_model(args.gguf)
    gen = Generator(lm.model, lm.model.new_cache(args.pp + 8), lm.tokenizer.vocab_size)
    ours_ms(gen, min(args.pp, 64), 0)
    ours, peer = [], []
    for r in range(args.rounds):
        ours.append(min(ours_ms(gen, args.pp, s) for s in range(1, 4)))
        peer.append(llama_ms(binary, args.gguf, args.pp) if binary else float("nan"))
        print(f"round {r + 1}: ours {ours[-1]:.0f} ms, llama.cpp {peer[-1]:.0f} ms CPU a pp{args.pp}", flush=True)
    if not binary:
        print(f"llama.cpp skipped: {why}")
    mo, mp = statistics.median(ours), statistics.median(peer)
    print(f"pp{args.pp} on one thread: ours {mo:.0f} ms ({args.pp / mo * 1e3:.0f} tok/s of one core), llama.cpp "
          f"{mp:.0f} ms ({args.pp / mp * 1e3:.0f}), llama.cpp / ours {mp / mo:.2f}x")


if __name__ == "__main__":
    main()
