"""Builds qdecode.c once per machine and loads it with ctypes.

The library is compiled with the machine's own C compiler (-O3 -march=native, pthreads, OpenMP
where it has it), at install time (install.sh) or on first use, named by a hash of the sources
and the flags, so an upgrade rebuilds it and two processes never load a half-written file.
Without a compiler `library()` returns None and the caller runs the slower PyTorch path
(launch prints why once).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

from model.paths import cache_root

SOURCE = Path(__file__).with_name("qdecode.c")
ATTEMPTS = (["-O3", "-march=native", "-fopenmp", "-pthread"], ["-O3", "-fopenmp", "-pthread"],
            ["-O3", "-march=native", "-pthread"], ["-O3", "-pthread"])


class QW(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("sdt", ctypes.c_int32), ("rows", ctypes.c_int32),
                ("cols", ctypes.c_int32), ("sub", ctypes.c_int32), ("pad", ctypes.c_int32),
                ("q", ctypes.c_void_p), ("scale", ctypes.c_void_p), ("min", ctypes.c_void_p),
                ("bias", ctypes.c_void_p)]


class Layer(ctypes.Structure):
    _fields_ = [(n, QW) for n in ("wq", "wk", "wv", "wo", "wg", "wu", "wd")] + [
        (n, ctypes.c_void_p) for n in ("attn_norm", "ffn_norm", "post_attn_norm", "post_ffn_norm", "q_norm",
                                        "k_norm", "cos", "sin")] + [("window", ctypes.c_int32), ("pad", ctypes.c_int32)]


class Model(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int32) for n in ("n_layers", "dim", "n_head", "n_kv", "head_dim", "hidden", "vocab",
                                              "cap", "act", "n_threads")] + [
        (n, ctypes.c_float) for n in ("eps", "emb_scale", "attn_scale", "final_softcap")] + [
        ("embed", QW), ("lm_head", QW), ("final_norm", ctypes.c_void_p), ("layers", ctypes.POINTER(Layer))]


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def sources() -> list[Path]:
    """qdecode.c and the files it includes (all of this folder's C and headers): a change to any
    rebuilds."""
    return sorted([*SOURCE.parent.glob("*.c"), *SOURCE.parent.glob("*.h")])


def _places(flags: list[str], cc: str) -> list[Path]:
    """Where the library for these flags may be: beside the source (built at install, one build
    for every chat home), then the cache directory. Both are looked in whether or not they are
    writable: a read-only home still finds the build made at install (issue 27)."""
    key = hashlib.sha256(b"".join(f.read_bytes() for f in sources()) + " ".join([cc, *flags, sys.platform]).encode())
    name = f"qdecode-{key.hexdigest()[:16]}.so"
    return [SOURCE.parent / "build" / name, cache_root() / "native" / name]


def writable(folder: Path) -> bool:
    """The folder exists and can be written, or could be made under a writable parent."""
    while not folder.exists():
        if folder.parent == folder:
            return False
        folder = folder.parent
    return os.access(folder, os.W_OK)


def _compile(cc: str, flags: list[str], out: Path) -> bool:
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.{os.getpid()}-", dir=out.parent)
    except OSError:  # a home that turned out read-only: the fp32 path, with its note
        return False
    os.close(fd)
    cmd = [cc, *flags, "-shared", "-fPIC", "-o", tmp, str(SOURCE), "-lm"]
    try:
        ok = subprocess.run(cmd, capture_output=True, timeout=120).returncode == 0
        if ok:
            os.replace(tmp, out)   # atomic: readers see the whole library or none
        return ok
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    lib.qd_new.restype = ctypes.c_void_p
    lib.qd_new.argtypes = [ctypes.POINTER(Model)]
    lib.qd_free.argtypes = [ctypes.c_void_p]
    lib.qd_step.restype = ctypes.c_int
    lib.qd_step.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                            ctypes.c_void_p]
    lib.qd_dequant.argtypes = [ctypes.POINTER(QW), ctypes.c_void_p, ctypes.c_int]
    lib.qg_dequant_bf16.argtypes = [ctypes.c_void_p, ctypes.POINTER(QW), ctypes.c_void_p]
    lib.qg_glu_bf16.argtypes = [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int] * 4
    lib.qd_gemv.argtypes = [ctypes.POINTER(QW), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    lib.qd_simd.restype = ctypes.c_int
    return lib


@cache
def library() -> ctypes.CDLL | None:
    """The compiled kernels, building them on first use; None without a working C compiler
    (or with NANOCHAT_NATIVE=0)."""
    mode = os.environ.get("NANOCHAT_NATIVE", "1")
    if mode == "0":
        return None
    attempts = [f for f in ATTEMPTS if "-march=native" not in f] if mode == "portable" else ATTEMPTS
    # the K-quant rows' activations, for A/B and error measurements: 0 int16 (as every other row),
    # "always" int8 per 32 whatever its error, 256 int8 per 256 (llama.cpp's Q8_K) likewise; the
    # default is int8 per 32 where its error is small (qdecode.c's K8_MAX_ERR), else int16
    extra = {"0": ["-DQD_NO_ACT8"], "always": ["-DK8_MAX_ERR=1e9f"],
             "256": ["-DK8_GROUP=256", "-DK8_MAX_ERR=1e9f"]}.get(os.environ.get("NANOCHAT_ACT8", ""), [])
    attempts = tuple([*f, *extra] for f in attempts)
    return next((lib for flags in attempts if (lib := build(flags)) is not None), None)


def build(flags: list[str], cc: str | None = None) -> ctypes.CDLL | None:
    """The kernels compiled with `flags` by `cc` (default: compiler()), reused when built before;
    None when that fails."""
    if (cc := cc or compiler()) is None:
        return None
    places = _places(flags, cc)
    for out in places:  # a build that exists, wherever it is readable
        if out.is_file() and (lib := load(out)) is not None:
            return lib
    for out in places:  # else the first place this user may write
        if writable(out.parent):
            return load(out) if _compile(cc, flags, out) else None
    return None


def portable_note() -> str | None:
    """One line when the kernels run their portable C path (a CPU without AVX2, FMA and F16C,
    or NANOCHAT_NATIVE=portable), else None."""
    lib = library()
    if lib is None or lib.qd_simd():
        return None
    why = "NANOCHAT_NATIVE=portable" if os.environ.get("NANOCHAT_NATIVE") == "portable" else \
        "this CPU has no AVX2/FMA/F16C"
    return f"nanochat-tui: note: CPU kernels built without SIMD ({why}); decode runs the portable C path (slower)"


def load(out: Path) -> ctypes.CDLL | None:
    try:
        return _bind(ctypes.CDLL(str(out)))
    except OSError:  # not a library we can load (a half-written one by an older version)
        try:
            out.unlink(missing_ok=True)
        except OSError:
            pass  # not ours to remove (a read-only install)
        return None


def why_not() -> str:
    """One line for the user when library() is None."""
    if os.environ.get("NANOCHAT_NATIVE", "1") == "0":
        return "NANOCHAT_NATIVE=0"
    if compiler() is None:
        return "no C compiler found (install gcc or clang)"
    if not any(writable(p.parent) for p in _places(ATTEMPTS[-1], compiler())):
        return f"no build of them is readable here and neither {SOURCE.parent / 'build'} nor {cache_root()} is writable"
    return "the C compiler failed on qdecode.c"


def describe(lib: ctypes.CDLL) -> str:
    """What this build runs, for install.sh's line: the decode's SIMD and the prefill's GEMMs
    (qg_simd 2: the VNNI GEMM; qg_bf16 1: AMX tiles, 2: AVX-512 BF16; model/cpu/prefill_gemm.py)."""
    parts = ["AVX2 decode" if lib.qd_simd() else "portable C"]
    if lib.qg_simd() == 2:
        parts.append("AVX-512 VNNI prefill")
    if bf16 := {1: "bf16 prefill on AMX tiles", 2: "bf16 prefill on AVX-512 BF16"}.get(lib.qg_bf16()):
        parts.append(bf16)
    return ", ".join(parts)


if __name__ == "__main__":   # `python -m model.cpu.native`: build now (install.sh does)
    lib = library()
    print(f"CPU kernels: built ({describe(lib)})" if lib else
          f"note: CPU kernels not built: {why_not()}; quantized models will run dequantized to fp32 (slower, "
          "more memory)")
