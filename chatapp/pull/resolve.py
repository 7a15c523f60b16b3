"""One resolver for every way of naming a model: `--model`, `/model`, the picker, a stored chat.

A name is one of: an existing path (it always wins), a pullable model's name (`gemma3-270m`,
`smollm2-135m-instruct`, or the folder name it installs as), `default`, or a `random:` /
`nanochat:` spec. `resolve` gives what the chat records (`spec`: portable, so a pulled model is
recorded by its name, not its folder) and what the loader takes (`path`). Reads only local
files unless asked to pull.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from chatapp.pull.fetch import DEFAULT, MODELS, ProgressFn, ensure_model, is_installed, manifest, model_dir
from model.errors import UserError

DEFAULT_NAME = "default"   # `/model default`: the default model


@dataclass(frozen=True)
class Resolved:
    spec: str    # what the chat records and the picker lists
    path: str    # what model.loading.load_model takes


def pullable(spec: str) -> str | None:
    """The pullable model `spec` names (by its name, its folder's name, or `default`), or None."""
    s = spec.strip().lower()
    if s == DEFAULT_NAME:
        return DEFAULT
    for name in MODELS:
        if s in (name, manifest(name).name.lower()):
            return name
    return None


def pulled_name(path: Path) -> str | None:
    """The pullable name whose installed folder `path` is, or None."""
    for name in MODELS:
        if path == model_dir(name):
            return name
    return None


def is_pulled(name: str) -> bool:
    return is_installed(model_dir(name))


def resolve(spec: str | None, pull: bool = True, progress: ProgressFn | None = None) -> Resolved:
    """`spec` (None: the default model) as a Resolved, or a one-line UserError. `pull=False`:
    a pullable model that is not installed is an error instead of a download."""
    if spec is None:
        spec = DEFAULT_NAME
    spec = spec.strip()
    if not spec:
        raise UserError("the model name is empty; leave it out for the default model")
    if spec.startswith(("random:", "nanochat:")):
        return Resolved(spec, spec)
    path = Path(spec).expanduser()
    if path.exists():
        path = path.resolve()
        name = pulled_name(path)
        return Resolved(name or str(path), str(path))
    name = pullable(spec)
    if name is None:
        raise UserError(f"model not found: {spec} (expected a directory, a .gguf file, a pullable model "
                        f"({', '.join(MODELS)}), random:tiny, or nanochat:sft)")
    if not is_pulled(name) and not pull:
        raise UserError(f"{name} is not pulled (nanochat-tui pull {name} fetches it)")
    return Resolved(name, str(ensure_model(name, progress=progress)))


def available(spec: str) -> bool:
    """Whether `spec` can be loaded without a download (pulled, cached, or at its path)."""
    try:
        resolve(spec, pull=False)
    except UserError:
        return False
    return True
