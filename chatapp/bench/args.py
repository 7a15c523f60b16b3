"""`nanochat-tui bench`'s flags: the parser and the `BenchArgs` every part of the bench reads."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch

from chatapp.bench.llamacpp import ENV
from chatapp.launch import check_device
from model.cpu import native
from model.errors import UserError

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
