"""The chat's command-line flags. Imports no torch: the CLI and the TUI's first frame read these.

Sampling flags default to None, so a flag the user typed is told apart from one left out even
when the typed value equals the default (`--resume --temperature 0.2` must override the stored
chat's temperature); the defaults come from `Settings` alone.
"""

from __future__ import annotations

import argparse

from chatapp.chat.settings import DEFAULTS
from model.errors import UserError

SUBCOMMANDS = ("pull", "tokenize", "bench", "serve")


def threads(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--threads takes a whole number of threads, at least 1 (got {text!r})")
    return int(text)


class FlagError(UserError):
    """A flag or the config file holds a value the app cannot start with (not a model failure)."""


def add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="model spec: a directory, a .gguf, random:tiny, nanochat:sft "
                   "(default: SmolLM2-135M-Instruct, fetched once)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 ... (default: cuda if present)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--attn", default="auto", choices=["auto", "fa3", "fa2", "sdpa"])
    p.add_argument("--step", type=int, help="nanochat: checkpoint step (default: the last)")
    p.add_argument("--threads", type=threads, help="CPU threads (default: the CPUs this process may use)")
    p.add_argument("--tokenizer", help="nanochat: path to tokenizer.pkl")
    p.add_argument("--model-tag", help="nanochat: model tag such as d20")


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    d = DEFAULTS
    p.add_argument("--max-new-tokens", type=int, help="cap a reply at this many tokens (default: no cap; a "
                   "reply ends at the model's end token, the full context or Esc)")
    p.add_argument("--temperature", type=float, help=f"0 is greedy (default: {d['temperature']})")
    p.add_argument("--top-k", type=int, help=f"0 is off (default: {d['top_k']})")
    p.add_argument("--top-p", type=float, help=f"nucleus sampling (default: {d['top_p']})")
    p.add_argument("--seed", type=int)
    p.add_argument("--min-p", type=float, help="drop tokens below this share of the best one's probability "
                   f"(default: {d['min_p']}, off)")
    p.add_argument("--repetition-penalty", type=float, help="divide a repeated token's logit by this; "
                   f"1 is off (default: {d['repetition_penalty']})")
    p.add_argument("--presence-penalty", type=float, help=f"-2 to 2 (default: {d['presence_penalty']})")
    p.add_argument("--frequency-penalty", type=float, help=f"-2 to 2 (default: {d['frequency_penalty']})")
    p.add_argument("--repeat-last-n", type=int, help="how many of the reply's last tokens the penalties "
                   f"count (default: {d['repeat_last_n']})")


def chat_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nanochat-tui", description="Chat with a small local model. "
                                f"Subcommands: {', '.join(SUBCOMMANDS)} (nanochat-tui SUBCOMMAND -h).")
    add_model_options(p)
    p.add_argument("--headless", action="store_true", help="read stdin, write JSON lines")
    p.add_argument("--jsonl", action="store_true",
                   help='headless, with input as {"user": ...} / {"command": ...} lines')
    p.add_argument("--multiline", action="store_true",
                   help="headless, a message being every line up to one holding only '.' (or the end of input): "
                        "cat prompt.txt | nanochat-tui --multiline is one message")
    add_sampling_options(p)
    p.add_argument("--system", help="system prompt (default: the model's own)")
    p.add_argument("--context", type=int, help="KV cache capacity in tokens (default: the model's context)")
    p.add_argument("--low-water", type=float, help="when the context fills, drop old exchanges down to this share "
                   f"of it, so the re-prefill is rare; 1 drops just enough (default: {DEFAULTS['low_water']})")
    stored = p.add_mutually_exclusive_group()
    stored.add_argument("--chat", type=int, metavar="ID", help="continue stored chat ID")
    stored.add_argument("--resume", action="store_true", help="continue the last chat")
    p.add_argument("--backend", metavar="URL", help="chat through an OpenAI-compatible server (nanochat-tui serve, "
                   "llama.cpp's llama-server, vLLM, ...) instead of a model in this process (docs/serve.md)")
    p.add_argument("--api-key", help="--backend: the server's API key (or set NANOCHAT_TUI_API_KEY)")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="--backend: seconds to wait for the server (default: 60)")
    p.add_argument("--no-store", action="store_true", help="keep nothing: chats are saved after every turn otherwise")
    return p


def given_sampling(args: argparse.Namespace) -> dict:
    """The sampling flags the user typed, whatever their values."""
    return {k: getattr(args, k) for k in DEFAULTS if getattr(args, k, None) is not None}
