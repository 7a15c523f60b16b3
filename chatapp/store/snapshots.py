"""KV snapshots: the filled prefix of a chat's cache on disk, so reopening it costs no prefill.

A chat's snapshot is a chain of safetensors *segments* in its own folder. Each segment holds
positions [start, end) of `k_cache`/`v_cache` and of every per-position `state` buffer. After a
turn only the new positions are written, so saving costs what the turn added, not the history.
Each segment records:
  - `prefix`: sha256 of the token ids [0, end) it was computed from. A segment is used only if
    the chat's stored tokens still start with exactly those tokens;
  - `identity`: the model that computed it (chatapp/fingerprint.py); another model's is never used;
  - `checksum`: sha256 of its tensor bytes, checked on every load, so a corrupt or truncated
    file is caught and the rest re-prefilled; it is never trusted blindly.
Writes are atomic (chatapp/store/tempfiles.py): a temp file named with the writer's pid, fsync,
rename, fsync of the folder.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

from chatapp.store.identity import ModelIdentity
from chatapp.store.tempfiles import is_temp, remove_orphan_tmp, write_atomic
from kvcache import KVCache
from model.files import regular_file

FORMAT = "nanochat-tui-kv/1"
MAX_SEGMENTS = 16  # past this, the next save rewrites one whole segment (restore reads fewer files)
SUFFIX = ".safetensors"


@dataclass
class Segment:
    path: Path
    start: int
    end: int
    prefix: str
    identity: ModelIdentity


def token_hash(tokens: list[int]) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype="<i4").tobytes()).hexdigest()


@dataclass
class Rows:
    """A tensor of a segment as the blocks it is stored in, in order (a view of the cache each)."""
    shape: tuple[int, ...]
    dtype: torch.dtype
    blocks: list[torch.Tensor]

    def buffers(self) -> Iterator[np.ndarray]:
        for b in self.blocks:  # a CUDA cache's block comes to the host one layer at a time
            yield b.contiguous().cpu().reshape(-1).view(torch.uint8).numpy()

    @property
    def nbytes(self) -> int:
        return sum(b.numel() for b in self.blocks) * self.dtype.itemsize


def checksum(tensors: dict[str, torch.Tensor | Rows]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        rows = t if isinstance(t, Rows) else Rows(tuple(t.shape), t.dtype, [t])
        h.update(f"{name}:{rows.shape}:{rows.dtype};".encode())
        for buf in rows.buffers():
            h.update(buf)
    return h.hexdigest()


def segment_rows(cache: KVCache, start: int, end: int) -> dict[str, Rows]:
    """Positions [start, end) of K, V and each state, as views of the cache, layer by layer: a
    segment is written without a copy of it (a compaction's is the whole filled cache)."""
    n, (layers, batch, _t, heads, dim) = end - start, cache.shape
    rows = {name: Rows((layers, batch, n, heads, dim), cache.dtype, [t[layer, :, start:end] for layer in range(layers)])
            for name, t in (("k", cache.k_cache), ("v", cache.v_cache))}
    for name, buf in cache.state.items():
        rows[f"state.{name}"] = Rows((buf.shape[0], n, *buf.shape[2:]), buf.dtype, [buf[:, start:end]])
    return rows


SAFETENSORS_DTYPES = {torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32", torch.float64: "F64",
                      torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8"}


def safetensors_file(rows: dict[str, Rows], meta: dict[str, str]) -> Iterator[bytes | np.ndarray]:
    """The safetensors format, streamed: an 8-byte header length, the JSON header (padded with
    spaces to 8 bytes, as safetensors writes it), then each tensor's bytes in header order."""
    header: dict = {"__metadata__": meta}
    offset = 0
    for name, r in rows.items():
        header[name] = {"dtype": SAFETENSORS_DTYPES[r.dtype], "shape": list(r.shape),
                        "data_offsets": [offset, offset + r.nbytes]}
        offset += r.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    yield struct.pack("<Q", len(text)) + text
    for r in rows.values():
        yield from r.buffers()


def write_segment(folder: Path, cache: KVCache, start: int, end: int, tokens: list[int],
                  identity: ModelIdentity) -> Segment:
    """Save positions [start, end) of the cache, computed from tokens[:end]. Atomic."""
    rows = segment_rows(cache, start, end)
    seg = Segment(folder / f"{start:08d}-{end:08d}{SUFFIX}", start, end, token_hash(tokens[:end]), identity)
    meta = {"format": FORMAT, "start": str(start), "end": str(end), "prefix": seg.prefix,
            "identity": identity.to_json(), "checksum": checksum(rows)}
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(seg.path, safetensors_file(rows, meta))
    return seg


def read_header(path: Path) -> Segment | None:
    """The segment's metadata, or None for a file that is not a readable segment."""
    try:
        regular_file(path, "snapshot")  # a FIFO would block safe_open forever
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        if meta.get("format") != FORMAT:
            return None
        return Segment(path, int(meta["start"]), int(meta["end"]), meta["prefix"],
                       ModelIdentity.from_json(meta["identity"]))
    except Exception:  # any damage at all means: not usable (the loader re-prefills instead)
        return None


def scan(folder: Path) -> tuple[list[Segment], list[Path]]:
    """Readable segments, and the paths of unreadable ones. Temp files of dead writers go."""
    if not folder.is_dir():
        return [], []
    good, bad = [], []
    for p in sorted(folder.iterdir()):
        if is_temp(p.name):
            remove_orphan_tmp(p)
        elif p.name.endswith(SUFFIX):
            seg = read_header(p)
            (good if seg else bad).append(seg or p)
    return good, bad


def plan_chain(segments: list[Segment], tokens: list[int], identity: ModelIdentity,
               limit: int) -> tuple[list[Segment], str]:
    """The longest chain [0, a), [a, b), ... of segments valid for `tokens[:limit]`, and why it
    stops where it does ("" when nothing stands in the way)."""
    chain, end, why = [], 0, ""
    while True:
        nexts = [s for s in segments if s.start == end and s.end > end]
        usable = [s for s in nexts if s.end <= limit and s.identity == identity
                  and s.prefix == token_hash(tokens[:s.end])]
        if not usable:
            if nexts and not why:
                why = explain(nexts, tokens, identity, limit)
            return chain, why
        best = max(usable, key=lambda s: s.end)
        chain.append(best)
        end = best.end


def explain(nexts: list[Segment], tokens: list[int], identity: ModelIdentity, limit: int) -> str:
    for s in nexts:
        if reason := identity.mismatch(s.identity):
            return f"snapshot {reason}"
    if all(s.end > limit for s in nexts):
        return "snapshot runs past the stored chat"
    return "snapshot belongs to an earlier version of the chat"


def load_chain(cache: KVCache, chain: list[Segment]) -> tuple[int, str]:
    """Empty the cache, then copy the chain into it, checking every segment; stops at the first
    bad one. Returns (positions restored, why it stopped early or "")."""
    cache.reset()
    n, why = 0, ""
    for seg in chain:
        try:
            regular_file(seg.path, "snapshot")  # still the file scan read
            with safe_open(str(seg.path), framework="pt") as f:
                want = (f.metadata() or {}).get("checksum")
                if problem := unexpected(f, cache, seg):  # from the header, before any tensor is read
                    why = f"snapshot file {seg.path.name}: {problem}"
                    break
                tensors = {name: f.get_tensor(name) for name in f.keys()}
        except Exception:
            why = f"snapshot file {seg.path.name} is unreadable (truncated?)"
            break
        if checksum(tensors) != want:
            why = f"snapshot file {seg.path.name} is corrupt (checksum mismatch)"
            break
        if problem := copy_in(cache, seg, tensors):
            why = f"snapshot file {seg.path.name}: {problem}"
            break
        n = seg.end
    cache.advance(n)
    return n, why


def expected_shapes(cache: KVCache, seg: Segment) -> dict[str, tuple[int, ...]]:
    """Exactly the tensors a segment of [start, end) holds for this cache: K, V and each state."""
    n = seg.end - seg.start
    kv = (*cache.shape[:2], n, *cache.shape[3:])
    out = {"k": kv, "v": kv}
    for name, buf in cache.state.items():
        out[f"state.{name}"] = (buf.shape[0], n, *buf.shape[2:])
    return out


def unexpected(f, cache: KVCache, seg: Segment) -> str:
    """Why the open segment `f` is not what this cache's segment holds ("" when it is): an extra
    3 GB tensor with a valid checksum must be refused unread, not loaded whole (issue 27)."""
    want = expected_shapes(cache, seg)
    if seg.end > cache.capacity or seg.start < 0 or seg.end <= seg.start:
        return f"positions [{seg.start}, {seg.end}) do not fit the cache of {cache.capacity}"
    if set(f.keys()) != set(want):
        return f"holds tensors {sorted(f.keys())[:6]}, expected {sorted(want)}"
    for name, shape in want.items():
        got = tuple(f.get_slice(name).get_shape())
        if got != shape:
            return f"{name} has shape {got}, expected {shape}"
    return ""


def copy_in(cache: KVCache, seg: Segment, tensors: dict[str, torch.Tensor]) -> str:
    length = seg.end - seg.start
    k, v = tensors.get("k"), tensors.get("v")
    want = (*cache.shape[:2], length, *cache.shape[3:])
    if k is None or v is None or tuple(k.shape) != want or tuple(v.shape) != want:
        return f"K/V shape {None if k is None else tuple(k.shape)} does not fit the cache {want}"
    if seg.end > cache.capacity:
        return f"holds {seg.end} positions, the cache {cache.capacity}"
    states = {n.removeprefix("state."): t for n, t in tensors.items() if n.startswith("state.")}
    if set(states) != set(cache.state):
        return f"state buffers {sorted(states)} differ from the model's {sorted(cache.state)}"
    for name, t in states.items():
        buf = cache.state[name]
        if buf.dtype != t.dtype or tuple(buf.shape[:1]) + tuple(buf.shape[2:]) != t.shape[:1] + t.shape[2:] \
                or t.shape[1] != length:
            return f"state {name} is {t.dtype}{tuple(t.shape)}, the model's {buf.dtype}{tuple(buf.shape)}"
    cache.k_cache[:, :, seg.start:seg.end].copy_(k)
    cache.v_cache[:, :, seg.start:seg.end].copy_(v)
    for name, t in states.items():
        cache.state[name][:, seg.start:seg.end].copy_(t)
    return ""


def snapshot_bytes(folder: Path) -> int:
    if not folder.is_dir():
        return 0
    return sum(p.stat().st_size for p in folder.iterdir() if p.name.endswith(SUFFIX))


@dataclass
class SyncResult:
    tokens: int        # positions the snapshot now covers
    written: int       # positions written by this sync
    bytes: int         # size of the snapshot on disk


class SnapshotWriter:
    """Keeps one chat's snapshot folder in step with its cache, writing only what is new."""

    def __init__(self, folder: Path, identity: ModelIdentity):
        self.folder, self.identity = folder, identity
        self.segments: list[Segment] | None = None  # scanned on first sync

    def sync(self, cache: KVCache, tokens: list[int], clean_upto: int) -> SyncResult:
        """After this, the snapshot covers tokens[:cache.seqlen]. `clean_upto`: cache positions at
        and past it may have been rewritten since the last sync (a retry, undo or trim), so
        segments reaching past it are dropped even when their token ids still match."""
        if self.segments is None:
            self.segments, bad = scan(self.folder)
            for p in bad:
                p.unlink(missing_ok=True)
        chain, _ = plan_chain(self.segments, tokens, self.identity, min(clean_upto, cache.seqlen))
        stale = [s for s in self.segments if s not in chain]
        end, written = (chain[-1].end if chain else 0), 0
        if len(chain) >= MAX_SEGMENTS and end < cache.seqlen:
            stale, chain, end = stale + chain, [], 0  # compact: one whole segment instead
        if end < cache.seqlen:
            seg = write_segment(self.folder, cache, end, cache.seqlen, tokens, self.identity)
            stale = [s for s in stale if s.path != seg.path]
            chain.append(seg)
            written = cache.seqlen - end
        for s in stale:
            s.path.unlink(missing_ok=True)
        self.segments = chain
        return SyncResult(chain[-1].end if chain else 0, written, snapshot_bytes(self.folder))
