"""`nanochat-tui bench`: multi-turn TTFT, decode speed and MBU, and a transformers peer, in one run.

Prints a readable table per model, then ONE JSON line last. Everything compared is measured
in the same run: persistent cache vs re-prefill, graph vs eager, ours vs transformers.
Run it as `nanochat-tui bench` (the CLI turns its UserErrors into one-line messages).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

import torch

from chatapp.bench.busy import busy_run, print_busy
from chatapp.bench.cpu import cpu_peer, print_cpu_peer, sources
from chatapp.bench.decode import decode_at, peak_bandwidth, weight_bytes_per_token, with_mbu
from chatapp.bench.gpu import gpu_peer, print_gpu_peer
from chatapp.bench.llamacpp import ENV, find_binary
from chatapp.bench.longchat import long_chat, print_long_chat
from chatapp.bench.models import resolve
from chatapp.bench.peer import hf_static_decode
from chatapp.bench.profile import graph_step_us, kernel_table
from chatapp.bench.report import print_model, summary_line
from chatapp.bench.resume import bench_resume
from chatapp.bench.tokenize import print_tokenizer_speed, tokenizer_speed
from chatapp.bench.turns import multiturn, script_tokens
from chatapp.launch import check_device
from model.cpu import native
from model.decode.generate import Generator
from model.decode.graph_config import GraphConfig
from model.errors import UserError
from model.loading import LoadOptions

GPU_MODELS = "default,random:d20,random:d32,random-nanochat:d20"
GPU_PEER_MODELS = "random:smollm2-135m,random:gemma3-270m,random:llama3.2-1b"


@dataclass
class BenchArgs:
    models: list[str]
    device: str
    dtype: torch.dtype
    quantized: bool
    attn: str
    gguf: str | None
    turns: int
    reply_tokens: int
    contexts: list[int]
    decode_tokens: int
    eager_tokens: int
    peer: bool
    variants: bool
    profile: bool
    ttft_reps: int
    resume: bool
    long_chat: bool = False
    context: int = 2048
    old_turns: int = 200
    cpu_peer: bool = False
    llama_bench: str | None = None
    threads: int = 0
    peer_reps: int = 3
    pp: int = 512
    tg: int = 64
    depth: int = 1500
    busy: bool = False
    gpu_peer: bool = False
    peer_ggufs: list[str] | None = None


def positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return n


def positives(text: str) -> list[int]:
    return [positive(t) for t in text.split(",")]


def specs(text: str) -> list[str]:
    out = [t.strip() for t in text.split(",")]
    if not all(out):
        raise argparse.ArgumentTypeError(f"an empty model spec in {text!r}")
    return out


def parse(argv: list[str]) -> BenchArgs:
    p = argparse.ArgumentParser(prog="nanochat-tui bench", description=__doc__.splitlines()[0])
    p.add_argument("--models", type=specs, help=f"comma-separated specs (GPU default: {GPU_MODELS}; "
                   "CPU default: random:smollm2-135m). 'default' is SmolLM2 from --gguf or the pulled copy")
    p.add_argument("--gguf", help="the SmolLM2 .gguf to convert and use for 'default'")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--attn", default="auto", choices=["auto", "fa3", "fa2", "sdpa"])
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke run in seconds")
    p.add_argument("--turns", type=positive, help="scripted turns (default 20; --long-chat 200)")
    p.add_argument("--ttft-reps", type=positive, help="replays of each turn's prefill, median TTFT (GPU 3, CPU 1)")
    p.add_argument("--reply-tokens", type=positive, help="tokens per scripted reply (GPU 256, CPU 8)")
    p.add_argument("--contexts", type=positives,
                   help="decode contexts, comma-separated (GPU 512,2048,8192; CPU 128,512)")
    p.add_argument("--decode-tokens", type=positive, help="timed decode steps per context (GPU 256, CPU 16)")
    p.add_argument("--no-peer", action="store_true", help="skip transformers' static-cache generate")
    p.add_argument("--no-variants", action="store_true", help="skip eager / plain-graph / FA3 comparisons")
    p.add_argument("--no-profile", action="store_true", help="skip the per-kernel profile of a decode step")
    p.add_argument("--resume", action="store_true", help="also time resuming a stored chat (chatapp.bench.resume)")
    p.add_argument("--long-chat", action="store_true", help="only the long chat past the context, once per trim "
                   "policy (chatapp.bench.longchat; default model 'default', 16-token replies)")
    p.add_argument("--context", type=positive, default=2048, help="--long-chat: the cache capacity (default 2048)")
    p.add_argument("--old-turns", type=positive, help="--long-chat: turns for the old policy (default: --turns)")
    p.add_argument("--cpu-peer", action="store_true", help="only ours against llama.cpp's llama-bench on the CPU: "
                   "same GGUF, threads and contexts (chatapp.bench.cpu; default model 'default')")
    p.add_argument("--llama-bench", help=f"--cpu-peer, --gpu-peer: the llama-bench binary (default: ${ENV}; "
                   "none: peer skipped)")
    p.add_argument("--threads", type=positive, help="--cpu-peer: threads for both (default: torch's current count)")
    p.add_argument("--busy", action="store_true", help="--cpu-peer: instead, ours and llama.cpp while the bench's "
                   "own hog keeps one core busy (chatapp.bench.busy)")
    p.add_argument("--peer-reps", type=positive, default=3,
                   help="--cpu-peer, --gpu-peer: repetitions of each test (default 3)")
    p.add_argument("--pp", type=positive, default=512, help="--cpu-peer: prefill test tokens (default 512)")
    p.add_argument("--tg", type=positive, default=64, help="--cpu-peer, --gpu-peer: decode test tokens (default 64)")
    p.add_argument("--depth", type=positive, default=1500, help="--cpu-peer: the deep decode's depth (default 1500)")
    p.add_argument("--gpu-peer", action="store_true", help="only prefill, turn TTFT and decode against llama.cpp's "
                   f"CUDA llama-bench (chatapp.bench.gpu; default models {GPU_PEER_MODELS})")
    p.add_argument("--peer-gguf", type=specs, help="--gpu-peer: the GGUF llama.cpp runs for each model, "
                   "comma-separated in --models order (e.g. random GGUFs of the same shapes)")
    a = p.parse_args(argv)
    if a.busy and not a.cpu_peer:
        p.error("--busy is a --cpu-peer run")
    if sum((a.cpu_peer, a.long_chat, a.gpu_peer)) > 1:
        p.error("--cpu-peer, --gpu-peer and --long-chat are separate runs")
    device = a.device if a.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    check_device(device, a.attn)
    gpu = device.startswith("cuda")
    dtype = a.dtype if a.dtype != "auto" else ("bfloat16" if gpu else "float32")
    quantized = a.dtype == "auto" and not gpu and native.library() is not None   # as the app runs
    quick = a.quick
    if a.cpu_peer and gpu:
        raise UserError("--cpu-peer compares against llama.cpp's CPU build: run it with --device cpu")
    if a.gpu_peer and not gpu:
        raise UserError("--gpu-peer compares against llama.cpp's CUDA build: it needs a CUDA device")
    fallback = ("default" if a.long_chat or a.cpu_peer else GPU_PEER_MODELS if a.gpu_peer
                else GPU_MODELS if gpu else "random:smollm2-135m")
    models = a.models or fallback.split(",")
    if a.peer_gguf and len(a.peer_gguf) != len(models):
        p.error(f"--peer-gguf names {len(a.peer_gguf)} files for {len(models)} models")
    turns = a.turns or (200 if a.long_chat else 20)
    contexts = a.contexts or ([64, 256] if quick else [512, 2048, 8192] if gpu else [128, 512])
    return BenchArgs(
        models=models, device=device, dtype=getattr(torch, dtype), quantized=quantized, attn=a.attn, gguf=a.gguf,
        turns=turns, reply_tokens=a.reply_tokens or (16 if a.long_chat else 4 if quick else 256 if gpu else 8),
        contexts=contexts,
        decode_tokens=a.decode_tokens or (8 if quick else 256 if gpu else 16),
        eager_tokens=8 if quick or not gpu else 32, peer=not a.no_peer, variants=gpu and not a.no_variants,
        profile=gpu and not a.no_profile, ttft_reps=a.ttft_reps or (3 if gpu else 1),
        resume=a.resume, long_chat=a.long_chat, context=a.context, old_turns=a.old_turns or turns,
        cpu_peer=a.cpu_peer, llama_bench=a.llama_bench, threads=a.threads or torch.get_num_threads(),
        peer_reps=a.peer_reps, pp=a.pp, tg=a.tg, depth=a.depth, busy=a.busy, gpu_peer=a.gpu_peer,
        peer_ggufs=a.peer_gguf)


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
    return {"context": gen.cache.pos, "graph_step_us": graph_step_us(gen.graphs),
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
    res = gpu_peer(lm, gguf, args.llama_bench, args.tg, args.peer_reps)
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
