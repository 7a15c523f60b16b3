"""`nanochat-tui bench`: multi-turn TTFT, decode speed and MBU, and a transformers peer, in one run.

Prints a readable table per model, then ONE JSON line last. Everything compared is measured
in the same run: persistent cache vs re-prefill, graph vs eager, ours vs transformers.
Run it as `nanochat-tui bench` (the CLI turns its UserErrors into one-line messages).
"""

from __future__ import annotations

import json
import sys

import torch

from chatapp.bench.args import BenchArgs, parse
from chatapp.bench.busy import busy_run, print_busy
from chatapp.bench.cpu import cpu_peer, print_cpu_peer, sources
from chatapp.bench.decode import decode_at, peak_bandwidth, weight_bytes_per_token, with_mbu
from chatapp.bench.gpu import gpu_peer, print_gpu_peer
from chatapp.bench.llamacpp import find_binary
from chatapp.bench.longchat import long_chat, print_long_chat
from chatapp.bench.models import resolve
from chatapp.bench.peer import hf_static_decode
from chatapp.bench.profile import graph_step_us, kernel_table
from chatapp.bench.report import print_model, summary_line
from chatapp.bench.resume import bench_resume
from chatapp.bench.startup import main as startup_main
from chatapp.bench.tokenize import print_tokenizer_speed, tokenizer_speed
from chatapp.bench.turns import multiturn, script_tokens
from model.decode.generate import Generator
from model.decode.graph_config import GraphConfig
from model.errors import UserError
from model.loading import LoadOptions


def capacity_for(lm, args: BenchArgs) -> int:
    need = max(max(args.contexts) + args.decode_tokens + 8, script_tokens(lm, args.turns, args.reply_tokens) + 8)
    return min(need, lm.context_length)


def decode_rows(gen: Generator, lm, args: BenchArgs, peak: float, tokens: int,
                contexts: list[int] | None = None) -> list[dict]:
    rows = []
    for ctx in contexts or args.contexts:
        ctx = min(ctx, gen.cache.capacity - tokens - 2)  # the rotary table ends at the model's context
        rows.append(with_mbu(decode_at(gen, ctx, tokens), lm.model, gen.cache, peak))
    return rows


def variants(lm, cache, args: BenchArgs, peak: float) -> dict[str, list[dict]]:
    """The same decode through each engine, on the same cache: what each layer of the fast path buys."""
    ends = sorted({args.contexts[0], args.contexts[-1]})
    out = {}
    configs = {"eager": None, "graph+torch": GraphConfig(fused=False), "graph+fused+fa3": GraphConfig(attn="fa3"),
               "graph+fused+triton (no lookahead)": GraphConfig(lookahead=False),
               "graph+fused+triton (no PDL)": GraphConfig(pdl=False)}
    for name, cfg in configs.items():
        try:
            gen = Generator(lm.model, cache, lm.tokenizer.vocab_size, graphs=cfg)
        except RuntimeError as e:
            out[name] = [{"skipped": str(e)}]
            continue
        tokens = args.eager_tokens if cfg is None or gen.graphs is None else args.decode_tokens
        engine = gen.graphs.name if gen.graphs is not None else "eager"
        out[name] = [dict(r, engine=engine) for r in decode_rows(gen, lm, args, peak, tokens, ends)]
        del gen
    return out


def profile(gen: Generator, context: int) -> dict:
    decode_at(gen, min(context, gen.cache.capacity - 8), 2)
    gen.graphs.settle()
    return {"context": gen.cache.seqlen, "graph_step_us": graph_step_us(gen.graphs),
            "kernels": kernel_table(gen.graphs)}


def resume_figures(lm, args: BenchArgs) -> dict:
    """The chat keeper's resume benchmark on the same model (its own store, its own sessions)."""
    tokens = 256 if args.reply_tokens <= 8 else 4096
    try:
        return bench_resume(lm, chat_tokens=min(tokens, lm.context_length - 600), device=args.device,
                            dtype=args.dtype)
    except Exception as e:  # reported, not fatal to the figures above
        return {"skipped": f"{type(e).__name__}: {e}"[:300]}


def load_options(args: BenchArgs) -> LoadOptions:
    return LoadOptions(device=args.device, dtype=args.dtype, attn=args.attn, quantized=args.quantized)


def bench_model(spec: str, args: BenchArgs, peak: float) -> dict:
    lm, note = resolve(spec, load_options(args), args.gguf)
    if (need := script_tokens(lm, args.turns, args.reply_tokens) + 8) > lm.context_length:
        raise UserError(f"{args.turns} turns of {args.reply_tokens}-token replies need {need} tokens; "
                        f"{lm.name} holds {lm.context_length} (lower --turns or --reply-tokens)")
    cache = lm.model.new_cache(capacity_for(lm, args))
    gen = Generator(lm.model, cache, lm.tokenizer.vocab_size)
    res = {"model": lm.name, "spec": spec, "note": note, "device": str(cache.device),
           "dtype": str(cache.dtype).removeprefix("torch."), "capacity": cache.capacity,
           "decode_engine": gen.graphs.name if gen.graphs is not None else "c-step" if gen.cpu_step else "eager",
           "weight_bytes_per_token": weight_bytes_per_token(lm.model)}
    res["multiturn"] = multiturn(lm, gen, args.turns, args.reply_tokens, args.ttft_reps)
    res["decode"] = decode_rows(gen, lm, args, peak, args.decode_tokens)
    res["backend"] = lm.model.attn.name
    if args.profile and gen.graphs is not None:
        res["profile"] = profile(gen, args.contexts[0])
    if args.variants:
        del gen
        res["variants"] = variants(lm, cache, args, peak)
    if args.peer:
        prompt = list(range(100, 100 + min(512, args.contexts[0])))
        res["peer"] = hf_static_decode(lm.model, prompt, args.decode_tokens)
        ours = next((r for r in res["decode"] if r["context"] >= len(prompt) * 0.5), res["decode"][0])
        if "tok_s" in res["peer"]:
            res["peer"]["ours_tok_s"] = ours["tok_s"]
            res["peer"]["ratio"] = ours["tok_s"] / res["peer"]["tok_s"]
    if args.resume:
        res["resume"] = resume_figures(lm, args)
    del cache, lm
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return res


def long_chat_model(spec: str, args: BenchArgs) -> dict:
    lm, note = resolve(spec, load_options(args), args.gguf)
    res = long_chat(lm, args.context, args.turns, args.reply_tokens, args.old_turns)
    return {"model": lm.name, "spec": spec, "note": note, "device": args.device, "long_chat": res}


def cpu_peer_model(spec: str, args: BenchArgs) -> dict:
    lm, note = resolve(spec, load_options(args), args.gguf)
    if args.busy:
        _, gguf, _ = sources(spec, args.gguf)
        binary, _ = find_binary(args.llama_bench)
        res = busy_run(lm, str(gguf) if gguf else None, binary, args.threads, args.pp, args.tg, args.peer_reps)
        return {"model": lm.name, "spec": spec, "note": note, "device": args.device, "cpu_busy": res}
    res = cpu_peer(lm, spec, args.gguf, args.llama_bench, args.threads, args.pp, args.tg, args.depth, args.peer_reps)
    return {"model": lm.name, "spec": spec, "note": note, "device": args.device, "cpu_peer": res}


def gpu_peer_model(spec: str, gguf: str | None, args: BenchArgs) -> dict:
    lm, note = resolve(spec, load_options(args), args.gguf)
    res = gpu_peer(lm, spec, gguf, args.llama_bench, args.tg, args.peer_reps)
    return {"model": lm.name, "spec": spec, "note": note, "device": args.device, "gpu_peer": res}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--tokenizers"]:   # tokenizer speed only: no model, no device
        if len(argv) != 2:
            raise UserError("bench --tokenizers DIR: give the folder of ggml-vocab-*.gguf files, nothing else")
        rows = tokenizer_speed(argv[1])
        print_tokenizer_speed(rows)
        print(json.dumps({"tokenizer_speed": rows}))
        return 0
    if argv[:1] == ["--startup"]:   # the TUI's start-up, in a pseudo-terminal: no model in this process
        return startup_main(argv[1:])
    args = parse(argv)
    device = torch.device(args.device)
    peak = peak_bandwidth(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"nanochat-tui bench on {name}: copy bandwidth {peak / 1e9:.0f} GB/s (read + write)")
    results = []
    for i, spec in enumerate(args.models):
        if args.gpu_peer:
            res = gpu_peer_model(spec, args.peer_ggufs[i] if args.peer_ggufs else None, args)
            print_gpu_peer(res["model"], res["note"], res["gpu_peer"])
        elif args.cpu_peer:
            res = cpu_peer_model(spec, args)
            if "cpu_busy" in res:
                print_busy(res["model"], res["cpu_busy"])
            else:
                print_cpu_peer(res["model"], res["note"], res["cpu_peer"])
        elif args.long_chat:
            res = long_chat_model(spec, args)
            print_long_chat(res["model"], res["note"], res["long_chat"])
        else:
            res = bench_model(spec, args, peak)
            print_model(res)
        results.append(res)
    print(json.dumps(summary_line(name, peak, results)))
    return 0
