"""`nanochat-tui serve`'s flags and the loopback rule. Imports no torch, so a refused flag is
answered at once, before the model loads."""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from pathlib import Path

from chatapp.options import add_model_options, add_sampling_options
from model.errors import ModelLoadError, UserError
from model.files import read_bytes

KEY_ENV = "NANOCHAT_TUI_API_KEY"
MAX_KEYS_FILE = 1 << 20


def serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nanochat-tui serve", description="An OpenAI-compatible chat server on the "
                                "in-process engine (docs/serve.md). Sampling flags are the defaults for requests "
                                "that do not set them.")
    add_model_options(p)
    add_sampling_options(p)
    p.add_argument("--context", type=int, help="KV cache capacity in tokens (default: the model's context)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000; 0 picks a free one)")
    p.add_argument("--allow-non-loopback", action="store_true",
                   help="needed for a --host other than loopback: the server is then reachable from the network")
    p.add_argument("--api-key", action="append", default=[], help="require Authorization: Bearer KEY on /v1/ "
                   f"(or set {KEY_ENV}); repeat it for several users: each key's requests share cached "
                   "prompts only with that key's")
    p.add_argument("--api-key-file", type=Path, help="more keys, one a line (# comments and blank lines skipped)")
    p.add_argument("--queue-size", type=int, default=128, help="requests that may wait for the engine; past "
                   "that they get 503 (default: 128)")
    p.add_argument("--kv-slots", type=int, default=3, help="KV snapshots of other conversations kept in memory "
                   "so they resume without a re-prefill (default: 3; 0 keeps none)")
    p.add_argument("--kv-budget-mb", type=int, default=2048, help="memory the snapshots may take (default: 2048)")
    return p


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def check_flags(args: argparse.Namespace) -> str | None:
    """UserError for flags that cannot work; the warning to print, if any. Sets `args.api_keys`."""
    args.api_keys = api_keys(args.api_key, args.api_key_file, os.environ.get(KEY_ENV))
    if args.queue_size < 1 or args.kv_slots < 0 or args.kv_budget_mb < 0:
        raise UserError("--queue-size must be >= 1, --kv-slots and --kv-budget-mb >= 0")
    if is_loopback(args.host):
        return None
    if not args.allow_non_loopback:
        raise UserError(f"--host {args.host} is not a loopback address: anyone who can reach it could use the "
                        "server; add --allow-non-loopback (and --api-key) to mean it")
    if not args.api_keys:
        return (f"nanochat-tui serve: warning: listening on {args.host} with no authentication: anyone who can "
                "reach this address can use the model (set --api-key)")
    return None


def parse(argv: list[str]) -> argparse.Namespace:
    """The checked flags (UserError for ones that cannot work); prints the no-auth warning."""
    args = serve_parser().parse_args(argv)
    if warning := check_flags(args):
        print(warning, file=sys.stderr)
    return args


def api_keys(given: list[str], path: Path | None, env: str | None) -> list[str]:
    """The keys of --api-key, then of --api-key-file; the environment's key only when neither
    gives one. UserError for an empty key or an unreadable file."""
    keys = list(given)
    if path is not None:
        try:
            text = read_bytes(path, "API keys file", MAX_KEYS_FILE).decode()
        except (ModelLoadError, UnicodeDecodeError) as e:
            raise UserError(f"--api-key-file: {e}") from None
        keys += [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        if not keys:
            raise UserError(f"--api-key-file {path}: holds no key")
    if not keys and env is not None:
        keys = [env]
    if any(not k.strip() or k != k.strip() for k in keys):
        raise UserError("--api-key: a key is empty or has spaces around it")
    return list(dict.fromkeys(keys))  # a key given twice is one user
