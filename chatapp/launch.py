"""From the command line's flags to a ready chat: the model loaded, the session made, the store
opened and, for --chat / --resume, the stored chat restored.

Shared by headless mode, the TUI and the benchmark, so all open models and chats the same way.
Flags the user typed (--temperature ...) override the stored chat's settings; the stored system
prompt always wins, since the chat's tokens were made with it. Imports torch: the TUI calls it
from its loading thread, never on the first frame.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from functools import partial

import torch

from chatapp.chat.commands import is_text
from chatapp.chat.memory import release_freed
from chatapp.chat.presets import Presets
from chatapp.chat.session import Session
from chatapp.chat.settings import DEFAULTS, Settings, parse_settings, settings_text
from chatapp.config import Config, load_config
from chatapp.keeper.chat_model import recorded_model
from chatapp.keeper.keeper import ChatKeeper
from chatapp.keeper.models import remember
from chatapp.options import FlagError, given_sampling
from chatapp.pull.resolve import available, resolve
from chatapp.store.database import ChatStore, data_home
from chatapp.store.records import StoreError
from kvcache.attention import available_backends
from model.cpu import native
from model.cpu.threads import use_threads
from model.errors import UserError
from model.escapes import to_stderr
from model.limits import cache_room, fitting_context
from model.loading import LoadOptions, load_model

Warn = Callable[[str], object]


PRESETS_FILE = "presets.json"   # /preset save's presets, next to the chats (chatapp/chat/presets.py)


def open_chat(args: argparse.Namespace, progress=None, warn: Warn | None = None) -> ChatKeeper:
    """The one chat object the faces talk to, ready for the first message."""
    config = load_config()
    keeper = open_keeper(open_session(args, progress, warn, config), args, warn, config)
    keeper.loader = loader_for(args)
    keeper.presets = Presets(config.presets, data_home() / PRESETS_FILE)
    if args.model and keeper.store is not None and not keeper.store.read_only:
        remember(keeper.store.root, args.model)  # the /model picker lists it
    return keeper


def loader_for(args: argparse.Namespace):
    """/model and a chat's own model load on the same device, dtype and attention; --step,
    --tokenizer and --model-tag name the first model's checkpoint files, not the next one's."""
    return partial(load_model, opts=dataclasses.replace(load_options(args), step=None, tokenizer=None, model_tag=None))


def load_options(args: argparse.Namespace) -> LoadOptions:
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    check_device(device, args.attn)
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if device.startswith("cuda") else "float32")
    # On the CPU a GGUF's own quantization is the default: its weights stay as the file holds
    # them and the C kernels decode (docs/weight-formats.md); --dtype float32 is the exact reference.
    quantized = args.dtype == "auto" and device == "cpu" and native.library() is not None
    return LoadOptions(device=device, dtype=getattr(torch, dtype), attn=args.attn, step=args.step,
                       tokenizer=args.tokenizer, model_tag=args.model_tag, quantized=quantized)


def native_note(args: argparse.Namespace) -> str | None:
    """Why a CPU run falls back to the slower fp32 path, once, or None."""
    on_cpu = args.device == "cpu" or (args.device == "auto" and not torch.cuda.is_available())
    if args.dtype != "auto" or not on_cpu:
        return None
    if native.library() is not None:
        return native.portable_note()
    return (f"nanochat-tui: note: CPU kernels unavailable ({native.why_not()}); quantized models run "
            "dequantized to fp32 (slower, more memory)")


def check_device(device: str, attn: str) -> None:
    """UserError for a device or attention backend this machine cannot run, before any loading."""
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise FlagError(f"--device {device!r} is not a device (try cpu, cuda or cuda:1)") from None
    if dev.type not in ("cpu", "cuda"):
        raise FlagError(f"--device {device}: only cpu and cuda devices are supported")
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        have = f"{torch.cuda.device_count()} CUDA device(s)" if torch.cuda.is_available() else "no CUDA"
        raise FlagError(f"--device {device}: this machine has {have}")
    if attn in ("fa3", "fa2") and (dev.type != "cuda" or attn not in available_backends()):
        raise FlagError(f"--attn {attn} is not available here (available: {', '.join(available_backends())}; "
                        f"flash attention needs --device cuda)")


def resolve_model_spec(spec: str | None, progress=None) -> str:
    """What the loader takes for `--model` (chatapp/pull/resolve.py: the one resolver)."""
    if spec is not None and not spec.strip():
        raise FlagError("--model is empty; leave it out for the default model")
    return resolve(spec, progress=progress).path


def settings_from(args: argparse.Namespace, config: Config | None = None) -> Settings:
    """The flags over the config file's [sampling] over the defaults."""
    config = config or Config()
    values = {**DEFAULTS, **config.sampling, **given_sampling(args)}
    if args.system is not None and not is_text(args.system):  # argv bytes that are not UTF-8
        raise FlagError("--system is not valid UTF-8 text")
    # One validator for flags and /set, so both reject the same values the same way.
    try:
        parse_settings(settings_text({k: v for k, v in values.items() if v is not None}))
    except UserError as e:
        raise FlagError(str(e)) from None
    return Settings(**values, system=args.system if args.system is not None else config.system)


def open_session(args: argparse.Namespace, progress=None, warn: Warn | None = None,
                 config: Config | None = None) -> Session:
    if args.context is not None and args.context < 16:
        raise FlagError("--context must be at least 16 tokens")
    use_threads(getattr(args, "threads", None))
    config = config or load_config()
    settings = settings_from(args, config)
    if args.model is not None and not args.model.strip():
        raise FlagError("--model is empty; leave it out for the default model")
    named, lm = load_first(args, config, progress, warn or to_stderr)
    settings.model = named.spec
    for line in lm.notes:
        (warn or to_stderr)(line)
    if args.context is not None and args.context > lm.context_length:
        (warn or to_stderr)(f"nanochat-tui: --context {args.context} is more than {lm.name} takes; "
                            f"using its {lm.context_length}")
    context = args.context or fitting(lm, warn or to_stderr)
    try:
        session = Session(lm, settings, context=context)
    except (MemoryError, OSError, RuntimeError) as e:  # the cache did not fit after all
        size = min(context or lm.context_length, lm.context_length)
        raise UserError(f"cannot allocate a {size:,}-token KV cache for {lm.name} ({e}); "
                        "try a smaller --context") from None
    release_freed()  # the load's temporaries: gemma3-270m's conversion left 216 MiB resident
    # Said once the chat is ready, so an error before it stays the only line on stderr.
    if note := native_note(args):
        (warn or to_stderr)(note)
    return session


def load_first(args: argparse.Namespace, config: Config, progress, warn: Warn):
    """(the resolved spec, the loaded model): the stored chat's own model when --resume / --chat
    has one here, else the flags' or the config's. If the chat's model fails to load, the usual
    one does (and reopening the chat says which model it opened on)."""
    if (own := stored_chat_model(args)) is not None:
        try:
            named = resolve(own, progress=progress)
            return named, load_model(named.path, load_options(args))
        except UserError as e:
            warn(f"nanochat-tui: warning: the chat's model {own} did not load ({e}); loading the usual one")
    named = resolve(args.model if args.model is not None else config.model, progress=progress)
    return named, load_model(named.path, load_options(args))


def stored_chat_model(args: argparse.Namespace) -> str | None:
    """--resume / --chat ID: the model the chat was made with when it is here, which reopening the
    chat switches to anyway (chatapp/keeper/chat_model.py). Loading it first spares a second
    load: the flags' (or the config's) model, then the chat's. None: the usual model serves."""
    asked, resume = getattr(args, "chat", None), getattr(args, "resume", False)
    if getattr(args, "no_store", False) or (asked is None and not resume):
        return None
    try:
        store = ChatStore(read_only=True)  # a peek: the keeper opens the store for real
    except StoreError:
        return None
    try:
        chat_id = asked if asked is not None else store.latest_id()
        record = store.get(chat_id) if chat_id is not None else None
    except StoreError:
        return None
    finally:
        store.close()
    want = recorded_model(record) if record is not None else None
    return want if want is not None and available(want) else None


def fitting(lm, warn: Warn) -> int | None:
    """The model's own context, or (with a note) the longest cache this machine can spare memory
    for: a config may claim 2**24 tokens. None: the model's own. --context overrides it."""
    device = str(next(lm.model.parameters()).device)
    per_token = lm.model.new_cache(1).bytes_per_token
    fit = fitting_context(lm.context_length, per_token, cache_room(device))
    if fit >= lm.context_length:
        return None
    warn(f"nanochat-tui: note: {lm.name} claims a {lm.context_length:,}-token context, whose KV cache "
         f"({lm.context_length * per_token / 2**30:,.1f} GiB) is more than this machine can spare; using "
         f"{fit:,} tokens (--context N asks for more)")
    return fit


def open_keeper(session: Session, args: argparse.Namespace, warn: Warn | None = None,
                config: Config | None = None) -> ChatKeeper:
    """The keeper for this run, with the stored chat already restored when asked for.
    UserError for flags that cannot work together or a chat that does not exist."""
    warn = warn or to_stderr
    asked, resume = getattr(args, "chat", None), getattr(args, "resume", False)  # --chat ID
    no_store = getattr(args, "no_store", False)
    if no_store and (asked is not None or resume):
        raise FlagError("--no-store cannot be combined with --chat or --resume")
    if (asked is not None or resume) and getattr(args, "system", None) is not None:
        raise FlagError("--system cannot change a stored chat's system prompt (use /system after it opens: "
                        "that starts a new chat)")
    if no_store:
        return ChatKeeper(session, None)
    budget = (config or Config()).snapshot_budget_mib
    try:
        store = ChatStore() if budget is None else ChatStore(snapshot_budget=budget << 20)
    except StoreError as e:
        if asked is not None or resume:
            raise
        warn(f"nanochat-tui: warning: chats will not be saved: {e}")
        return ChatKeeper(session, None, why_no_store=str(e))
    keeper = ChatKeeper(session, store)
    keeper.loader = loader_for(args)  # --resume may load the chat's own model
    chat_id = asked if asked is not None else (store.latest_id() if resume else None)
    if resume and chat_id is None:
        warn("nanochat-tui: no stored chat to resume; starting a new one")
    if chat_id is not None:
        try:
            _restored, errors = keeper.open(chat_id)
        except StoreError as e:
            if asked is not None:  # asked for by number: say why, start nothing
                raise
            # --resume: the latest chat cannot open (damaged, too long): the others stay reachable
            warn(f"nanochat-tui: warning: could not resume: {e}; starting a new chat")
            return keeper
        for e in errors:
            warn(f"nanochat-tui: warning: {e.message}")
        for k, v in given_sampling(args).items():  # on the chat's own model's session, if it has one
            setattr(keeper.session.settings, k, v)
    return keeper
