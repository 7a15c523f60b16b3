"""GGUF files (Llama, Qwen2, Qwen3, Gemma 3): what their tensors become.

Every tensor keeps its quantization: block types are repacked into our block formats
(model/cpu/blocks.py, exact), the others are the file's own bytes. Tensors are renamed to Hugging
Face's naming by the family's `GGUFLayout` (model/families/declare.py, declared in the family's
file, which also says what llama.cpp's converter changed for it), llama.cpp's Q/K row permutation
is undone, and a `rope_freqs` tensor (Llama 3.x scaling) becomes config.json's rope_freq_factors.

Opening a GGUF (model/loading/gguf_open.py) makes these tensors in memory and writes nothing
model-sized. `convert_gguf` writes them as a whole model directory: what `nanochat-tui pull`
installs, since it keeps no GGUF.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from model.chat_formats.completion import gguf_tuning
from model.cpu import file_blocks
from model.cpu.blocks import BLOCK_TYPES, Packed, repack
from model.errors import ModelLoadError
from model.families.declare import GGUFLayout
from model.families.registry import gguf_families
from model.loading.gguf_meta import GGUFFile, hf_config, open_gguf, tokenizer_files
from model.loading.safetensors_out import TensorSpec, write_safetensors

Progress = Callable[[str, float, float], None]   # (stage, done, total)
CONVERTER_VERSION = "6"   # bump when the output of convert_gguf changes: cached conversions are redone
# (6: config.json nanochat_tui_tuning, which gives a base model completion mode)

TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
DENSE_TYPES = ("F32", "F16", "BF16")
SUPPORTED_TYPES = DENSE_TYPES + BLOCK_TYPES + file_blocks.FILE_TYPES   # run quantized (others: see tensor_plan)
DEQUANTIZED = "nanochat_tui_dequantized_types"   # config.json: {type: tensors} of types run as exact fp32
PAD = "nanochat.pad."   # filler tensors that keep the next tensor aligned; loaders skip them
NUMPY_SIZE = {"F32": 4, "F16": 2, "BF16": 2, "U8": 1, "I8": 1}


ROPE_FREQS = "rope_freqs.weight"


def hf_name(name: str, where: str, layout: GGUFLayout) -> str:
    """llama.cpp's tensor name -> Hugging Face's, by the family's layer names."""
    if name in TOP_NAMES:
        return TOP_NAMES[name]
    blk, n, part, kind = (name.split(".") + ["", "", "", ""])[:4]
    if (blk == "blk" and n.isdigit() and part in layout.layer_names and name.count(".") == 3
            and (kind == "weight" or (kind == "bias" and part in layout.biased))):
        return f"model.layers.{n}.{layout.layer_names[part]}.{kind}"
    raise ModelLoadError(f"{where}: unexpected tensor {name!r} (supported: {layout.what} tensors)")


def rope_freq_factors(t, where: str) -> list[float]:
    """llama.cpp's rope_freqs: one F32 divisor per rotary frequency (Llama 3.x scaling)."""
    if t.tensor_type.name != "F32":
        raise ModelLoadError(f"{where}: {ROPE_FREQS} has type {t.tensor_type.name}, expected F32")
    return [float(x) for x in np.asarray(t.data, dtype=np.float32).ravel()]


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K permutation. Its converter interleaves each head's two rotary
    halves (rows [h, half, j] -> [h, j, half]) for GGML's pairwise rope; our rotary rotates
    halves, as Hugging Face's does."""
    rows, cols = w.shape
    return w.reshape(n_head, rows // n_head // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def tensor_plan(g: GGUFFile, config: dict) -> list[tuple[TensorSpec, object, str]]:
    """What to write: (spec, the GGUF tensor it comes from, which part of it). Block-quantized
    tensors become three parts (scale, min, values; blocks.py); a rope_freqs tensor goes into
    `config` instead. Parts are ordered so every tensor starts aligned to its element size."""
    plan, offset, pads = [], 0, 0
    layout = gguf_families()[g.arch].gguf
    for t in g.reader.tensors:
        if t.name == ROPE_FREQS:   # not a weight: config.json carries it
            config["rope_freq_factors"] = rope_freq_factors(t, str(g.path))
            continue
        kind = t.tensor_type.name
        if kind not in SUPPORTED_TYPES:
            if not file_blocks.dequantizable(kind):
                raise ModelLoadError(f"{g.path}: tensor {t.name} has type {kind}, which nanochat-tui cannot "
                                     f"read; supported types: {', '.join(SUPPORTED_TYPES)} and the other types "
                                     "the gguf package dequantizes (re-quantize the file, e.g. to Q4_K_M)")
            # No kernel for this type: its exact fp32 values (bigger and slower, but right). Noted.
            counts = config.setdefault(DEQUANTIZED, {})
            counts[kind] = counts.get(kind, 0) + 1
        name = hf_name(t.name, str(g.path), layout)
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        if kind not in SUPPORTED_TYPES or kind in DENSE_TYPES or len(shape) != 2:
            parts = [(TensorSpec(name, kind if kind in ("F16", "BF16") else "F32", shape), "dense")]
        else:
            parts = [(TensorSpec(f"{name}.{p}", dt, s), p) for p, dt, s in packed_specs(kind, shape)]
        for spec, part in parts:
            align = NUMPY_SIZE[spec.dtype]
            if offset % align:   # safetensors allows no gaps: a filler tensor keeps the next one aligned
                pad = TensorSpec(f"{PAD}{pads}", "U8", (align - offset % align,))
                plan.append((pad, None, "pad"))
                offset, pads = offset + pad.nbytes, pads + 1
            plan.append((spec, t, part))
            offset += spec.nbytes
    return plan


def packed_specs(kind: str, shape: tuple[int, int]) -> list[tuple[str, str, tuple[int, ...]]]:
    """(part, safetensors dtype, shape) of a block tensor, without decoding it."""
    rows, cols = shape
    if kind in file_blocks.FILE_TYPES:   # the file's own bytes
        return [(kind.lower(), "U8", (rows, file_blocks.row_bytes(kind.lower(), cols)))]
    values = ("q4", "U8", (rows, cols // 2)) if kind in ("Q4_0", "Q4_1") else ("q8", "I8", (rows, cols))
    scales = [("scale", "F16", (rows, cols // 32))]
    if kind != "Q8_0":
        scales.append(("min", "F16", (rows, cols // 32)))
    return scales + [values]


def tensor_data(t, part: str, config: dict, cache: dict, layout: GGUFLayout) -> np.ndarray:
    """One part's array. A block tensor is repacked once for its three parts (`cache`)."""
    kind = t.tensor_type.name
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    if part == "dense":
        w = np.asarray(t.data)
        if kind not in DENSE_TYPES:   # a type without a kernel: the gguf package's exact values
            from gguf import quants  # lazy: only a conversion needs it, and it costs every start 0.1 s

            w = quants.dequantize(w, t.tensor_type)
        w = (w.view(np.uint16) if kind == "BF16" else w.view(np.float16) if kind == "F16"
             else w.astype(np.float32, copy=False))   # a view of the file where it can be
        w = w.reshape(shape)
        if layout.fix_tensor is not None:
            return layout.fix_tensor(t.name, w)
        return permuted(w, t.name, config) if w.ndim == 2 else w
    if part in file_blocks.KINDS:
        return permuted(file_blocks.as_rows(part, np.asarray(t.data), *shape), t.name, config)
    if cache.get("name") != t.name:
        rows, cols = shape
        cache.clear()
        cache.update(name=t.name, packed=repack(kind, np.asarray(t.data), rows, cols))
    p: Packed = cache["packed"]
    arr = {"scale": p.scale, "min": p.min, "q4": p.q, "q8": p.q}[part]
    return permuted(arr, t.name, config)


def permuted(w: np.ndarray, gguf_name: str, config: dict) -> np.ndarray:
    """Rows of Q and K back in Hugging Face's order (llama.cpp permutes them for `llama` only).
    Works on values, scales and mins alike: the permutation moves whole rows."""
    if config["model_type"] != "llama":
        return w
    if gguf_name.endswith("attn_q.weight"):
        return unpermute(w, config["num_attention_heads"])
    if gguf_name.endswith("attn_k.weight"):
        return unpermute(w, config["num_key_value_heads"])
    return w


def read_model(gguf_path: Path, progress: Progress | None = None, name: str | None = None,
               vocabulary: bool = True) -> tuple[GGUFFile, dict, list[tuple[TensorSpec, object, str]]]:
    """(the opened file, config.json's contents, its tensor plan): everything but the weights'
    bytes; without the `vocabulary` when the tokenizer's files are not to be written."""
    if progress:
        progress("read", 0, 1)   # GGUFReader takes seconds on a large vocabulary: say so first
    g = open_gguf(Path(gguf_path), vocabulary)
    config = hf_config(g, name or Path(gguf_path).stem)
    plan = tensor_plan(g, config)
    names = {s.name.rsplit(".", 1)[0] if part not in ("dense", "pad") else s.name for s, _, part in plan}
    for needed in ("model.embed_tokens.weight", "model.norm.weight"):
        if needed not in names:
            raise ModelLoadError(f"{gguf_path}: missing tensor {needed}")
    config["tie_word_embeddings"] = "lm_head.weight" not in names
    config["nanochat_tui_tuning"] = gguf_tuning(g.meta)   # 'base': completion mode when there is no template
    embd = next(t for s, t, part in plan if t is not None and t.name == "token_embd.weight")
    config["vocab_size"] = int(embd.shape[-1])   # padded vocabularies included
    return g, config, plan


def write_metadata(g: GGUFFile, config: dict, out_dir: Path) -> None:
    """config.json, tokenizer.json and tokenizer_config.json: the small files of a model directory."""
    tokenizer_json, tokenizer_config = tokenizer_files(g)   # builds the tokenizer once: errors surface now
    out_dir.mkdir(parents=True, exist_ok=True)
    files = (("config.json", config), ("tokenizer.json", tokenizer_json), ("tokenizer_config.json", tokenizer_config))
    for fname, data in files:
        text = json.dumps(data, ensure_ascii=False, indent=None if fname == "tokenizer.json" else 2)
        (out_dir / fname).write_text(text + "\n", encoding="utf-8")


def produce(g: GGUFFile, config: dict, plan: list) -> Callable[[TensorSpec], np.ndarray]:
    """spec -> its array, in plan order: a view of the file's mapping where the tensor is kept
    as the file has it, else made in memory (repacked, Q/K rows unpermuted, dequantized)."""
    sources = {s.name: (t, part) for s, t, part in plan}
    cache: dict = {}
    layout = gguf_families()[g.arch].gguf

    def one(spec: TensorSpec) -> np.ndarray:
        t, part = sources[spec.name]
        if part == "pad":
            return np.zeros(spec.shape, np.uint8)
        try:
            return tensor_data(t, part, config, cache, layout)
        except (ValueError, IndexError) as e:   # short data in a truncated file
            raise ModelLoadError(f"{g.path}: tensor {t.name} is unreadable ({e}); the file may be "
                                 "truncated") from None
    return one


def convert_gguf(gguf_path: Path, out_dir: Path, progress: Progress | None = None, name: str | None = None) -> Path:
    """Write the canonical model directory for a GGUF file into `out_dir` (created): what
    `nanochat-tui pull` installs, since it keeps no GGUF. Opening a GGUF writes none of this."""
    g, config, plan = read_model(gguf_path, progress, name)
    out_dir = Path(out_dir)
    write_metadata(g, config, out_dir)
    if progress:
        progress("read", 1, 1)
    report = (lambda i: progress("convert", i, len(plan))) if progress else None
    write_safetensors(out_dir / "model.safetensors", [s for s, _, _ in plan], produce(g, config, plan),
                      metadata={"format": "pt", "source": Path(gguf_path).name}, on_tensor=report)
    return out_dir


def staging_dir(parent: Path, prefix: str) -> Path:
    """A fresh temp dir in `parent` named after this process. Ones left by processes that died
    without cleaning up (SIGKILL, power loss) are removed first."""
    parent.mkdir(parents=True, exist_ok=True)
    for old in parent.glob(f"{prefix}*"):
        pid = old.name.removeprefix(prefix).split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:   # exists, owned by someone else
        return True
    return True


def missing_dirs(path: Path) -> list[Path]:
    """`path` and its ancestors that do not exist yet, deepest first."""
    out = []
    while not path.exists():
        out.append(path)
        path = path.parent
    return out


def remove_empty(dirs: list[Path]) -> None:
    """Undo our mkdirs after a failure, so a failed attempt leaves the cache as it found it."""
    for d in dirs:
        try:
            d.rmdir()
        except OSError:   # not empty: someone else uses it now
            return
