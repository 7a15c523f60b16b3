"""A GGUF opened in place: nothing model-sized is written (docs/weight-formats.md).

The weights the C step reads are the file's own bytes, read from its mapping, or made from them
at load (repacked, Q/K rows unpermuted: model/loading/gguf.py), and on the CPU's quantized path
copied into the huge-page arena (model/cpu/hugepages.py) with the file's pages let go as each
tensor is copied, so the weights are never resident twice. Only config.json and the tokenizer's
files are cached (`metadata_dir`, a few MB), so a second open skips building the tokenizer.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import numpy as np
import torch

from model.cpu.hugepages import Arena, aligned, arena, release
from model.errors import ModelLoadError
from model.loading.gguf import (
    CONVERTER_VERSION,
    GGUFFile,
    missing_dirs,
    produce,
    read_model,
    remove_empty,
    staging_dir,
    write_metadata,
)
from model.loading.hf import load_hf_dir
from model.loading.options import LoadedModel, LoadOptions
from model.paths import cache_root

TORCH = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "U8": torch.uint8, "I8": torch.int8}


def weights_in_place(g: GGUFFile, config: dict, plan: list, arena: Arena | None) -> dict[str, torch.Tensor]:
    """The model's tensors without a model-sized file: views of the GGUF's mapping or arrays
    made at load, each copied into `arena` when there is one. The file pages a tensor was read
    from leave our resident memory once it has a copy, so the file's bytes are never held twice."""
    make = produce(g, config, plan)
    out = {}
    for spec, t, part in plan:
        if part == "pad":
            continue
        arr = make(spec)
        w = torch.from_numpy(np.ascontiguousarray(arr))
        w = w.view(TORCH[spec.dtype]) if spec.dtype == "BF16" else w
        out[spec.name] = w if arena is None else arena.put(w)   # put lets a view's file pages go
        src = np.asarray(t.data)
        if not np.may_share_memory(arr, src):   # made from the file: its pages are not read again
            release(src.ctypes.data, src.nbytes)
    return out


def metadata_dir(gguf_path: Path) -> Path:
    """Where this exact file's small files live (config.json and the tokenizer's, no weights):
    keyed by path, size and mtime. (Copies an older release converted, weights and all, sit
    under cache_root()/gguf/; nothing reads or writes them any more.)"""
    st = gguf_path.stat()
    key = f"{gguf_path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{CONVERTER_VERSION}"
    return cache_root() / "gguf-meta" / f"{gguf_path.stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def metadata_atomically(g: GGUFFile, config: dict, final: Path) -> None:
    """Write the small files into a temp dir beside `final`, then rename: complete or absent."""
    tmp = staging_dir(final.parent, f".{final.name}.partial-")
    try:
        write_metadata(g, config, tmp)
        os.rename(tmp, final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (final / "config.json").exists():   # unless a concurrent load won the race
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_gguf(path: Path, opts: LoadOptions) -> LoadedModel:
    """Open a GGUF in place: weights from its mapping (or made from it at load), config and
    tokenizer from a small cache written on first use."""
    path = Path(path)
    target = metadata_dir(path)
    created = missing_dirs(target.parent)
    try:
        cached = (target / "config.json").exists()
        g, config, plan = read_model(path, vocabulary=not cached)   # a cached tokenizer: its strings unread
        if not cached:
            metadata_atomically(g, config, target)
        area = arena(sum(aligned(s.nbytes) for s, _, part in plan if part != "pad")) if opts.quantized else None
        weights = weights_in_place(g, config, plan, area)
        del g, plan
        return load_hf_dir(target, opts, weights)
    except ModelLoadError as e:
        # Small files of a model that cannot load are not worth keeping; and the error names
        # the file the user gave, not our cache.
        shutil.rmtree(target, ignore_errors=True)
        remove_empty(created)
        raise ModelLoadError(str(e).replace(str(target), str(path))) from None
    except BaseException:
        remove_empty(created)
        raise
