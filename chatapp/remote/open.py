"""`--backend URL` from the flags to a ready `RemoteKeeper`: the server asked for its model,
the store opened, `--chat` / `--resume` reopened by their text. Imports no torch."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

from chatapp.chat.settings import DEFAULTS, Settings, parse_settings, settings_text
from chatapp.options import given_sampling
from chatapp.remote.client import OpenAIClient
from chatapp.remote.keeper import RemoteKeeper
from chatapp.remote.session import RemoteSession
from chatapp.remote.wire import RemoteError
from chatapp.store.database import ChatStore
from chatapp.store.records import StoreError
from model.errors import UserError

KEY_ENV = "NANOCHAT_TUI_API_KEY"
LOCAL_ONLY = ("model", "step", "tokenizer", "model_tag", "context")


def open_remote(args: argparse.Namespace, warn: Callable[[str], object]) -> RemoteKeeper:
    for name in LOCAL_ONLY:
        if getattr(args, name, None) is not None:
            raise UserError(f"--{name.replace('_', '-')} is for the in-process model; with --backend the "
                            "server decides it")
    if not args.backend.startswith(("http://", "https://")):
        raise UserError(f"--backend {args.backend!r}: give the server's URL, e.g. http://127.0.0.1:8080/v1")
    client = OpenAIClient(args.backend, args.api_key or os.environ.get(KEY_ENV), args.timeout)
    try:
        info = client.info()
    except RemoteError as e:
        client.close()
        raise UserError(f"--backend: {e}") from None
    values = {**DEFAULTS, **given_sampling(args)}
    parse_settings(settings_text({k: v for k, v in values.items() if v is not None}))
    session = RemoteSession(client, info.model, Settings(**values, system=args.system), info.context, info.server)
    keeper = RemoteKeeper(session, open_store(args, warn))
    if keeper.store is not None and (args.chat is not None or args.resume):
        for ev in keeper.load(str(args.chat) if args.chat is not None else ""):
            del ev  # the Restored event: the faces show keeper.restored
    return keeper


def open_store(args: argparse.Namespace, warn: Callable[[str], object]) -> ChatStore | None:
    if args.no_store:
        if args.chat is not None or args.resume:
            raise UserError("--no-store cannot be combined with --chat or --resume")
        return None
    try:
        return ChatStore()
    except StoreError as e:
        if args.chat is not None or args.resume:
            raise UserError(str(e)) from None
        warn(f"nanochat-tui: warning: chats will not be saved: {e}")
        return None
