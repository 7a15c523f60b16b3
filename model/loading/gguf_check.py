"""A GGUF header walked with every count checked before anything is allocated or looped over.

The `gguf` package's reader trusts the header: an array of 2**40 entries, a vocabulary of 10**7
strings, nested arrays or a tensor of 2**40 elements become allocations, long loops or a
RecursionError before any check of ours could run (issue 27). So `check_gguf` reads the header
first, with struct over a memory map: each count against the bytes left in the file and a sane
maximum, arrays one level deep, at most 4 dimensions, and every tensor's bytes inside the file.
A refusal is one `ModelLoadError` line and costs milliseconds; a real file's walk costs about
what reading its vocabulary does.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

from model.errors import ModelLoadError
from model.files import regular_file
from model.limits import MAX_ARRAY, MAX_KEY, MAX_STRING, MAX_TENSORS

MAGIC = b"GGUF"
SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUFValueType -> bytes
STRING, ARRAY = 8, 9
MAX_DIMS = 4  # GGML_MAX_DIMS
U64 = struct.Struct("<Q")


class Walk:
    def __init__(self, buf: mmap.mmap, path: Path):
        self.buf, self.path, self.at, self.size = buf, path, 0, len(buf)

    def fail(self, what: str) -> ModelLoadError:
        return ModelLoadError(f"{self.path}: not a readable GGUF file, truncated or corrupt ({what}, at byte "
                              f"{self.at:,})")

    def take(self, n: int) -> int:
        if n < 0 or self.at + n > self.size:
            raise self.fail(f"needs {n} bytes, the file has {self.size - self.at} left")
        start, self.at = self.at, self.at + n
        return start

    def u32(self) -> int:
        return struct.unpack_from("<I", self.buf, self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack_from("<Q", self.buf, self.take(8))[0]

    def count(self, what: str, most: int, each: int) -> int:
        """A u64 count of items of at least `each` bytes: no more than the file can hold."""
        n = self.u64()
        if n > most or n * each > self.size - self.at:
            raise self.fail(f"{what} claims {n:,} entries (at most {most:,}, and the file has "
                            f"{self.size - self.at:,} bytes left)")
        return n

    def string(self, what: str, most: int = MAX_STRING) -> str:
        n = self.count(f"{what}'s length", most, 1)
        raw = bytes(self.buf[self.take(n):self.at])
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8") from None

    def skip_strings(self, n: int, key: str) -> None:
        """n length-prefixed strings, lengths checked, bytes not decoded (the reader decodes them):
        a vocabulary's 262,144 entries in a tight loop."""
        at, size, unpack = self.at, self.size, U64.unpack_from
        for _ in range(n):
            if at + 8 > size:
                break
            length = unpack(self.buf, at)[0]
            at += 8
            if length > MAX_STRING or at + length > size:
                break
            at += length
        else:
            self.at = at
            return
        self.at = at
        raise self.fail(f"an entry of {key} runs past the end of the file")

    def value(self, kind: int, key: str, depth: int = 0) -> None:
        if kind in SCALAR:
            self.take(SCALAR[kind])
        elif kind == STRING:
            self.string(f"{key}'s value")
        elif kind == ARRAY and depth == 0:
            item = self.u32()
            if item == ARRAY:
                raise self.fail(f"{key} is an array of arrays (not used by any model we load)")
            n = self.count(key, MAX_ARRAY, SCALAR.get(item, 8))
            if item in SCALAR:
                self.take(n * SCALAR[item])
            elif item == STRING:
                self.skip_strings(n, key)
            else:
                raise self.fail(f"{key} holds items of unknown type {item}")
        else:
            raise self.fail(f"{key} has unknown value type {kind}")


def check_gguf(path: Path) -> None:
    """ModelLoadError, in one line, for a header whose counts or tensor ranges do not fit."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType  # lazy, as gguf_meta's reader

    size = regular_file(path, "model file")
    if size < 24:
        raise ModelLoadError(f"{path}: not a readable GGUF file, truncated or corrupt ({size} bytes)")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        w = Walk(buf, path)
        if bytes(buf[:4]) != MAGIC:
            raise ModelLoadError(f"{path}: not a readable GGUF file, truncated or corrupt (no GGUF magic)")
        w.take(4)
        if w.u32() not in (2, 3):
            raise w.fail("GGUF version is not 2 or 3")
        tensors = w.count("the tensor count", MAX_TENSORS, 24)
        keys = w.count("the metadata count", MAX_TENSORS, 12)
        alignment = 32
        for _ in range(keys):
            key = w.string("a metadata key", MAX_KEY)
            kind, at = w.u32(), w.at
            w.value(kind, key)   # its bytes are in the file before any is read back
            if key == "general.alignment":
                if kind != 4:
                    raise w.fail(f"general.alignment has value type {kind}, not uint32")
                alignment = struct.unpack_from("<I", buf, at)[0]
        if alignment < 1 or alignment & (alignment - 1) or alignment > 1 << 20:
            raise w.fail(f"general.alignment {alignment} is not a power of two")
        spans = []
        for _ in range(tensors):
            name = w.string("a tensor name", MAX_KEY)
            dims = w.u32()
            if not 1 <= dims <= MAX_DIMS:
                raise w.fail(f"tensor {name!r} has {dims} dimensions (at most {MAX_DIMS})")
            shape = [w.u64() for _ in range(dims)]
            kind, offset = w.u32(), w.u64()
            try:
                block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
            except (ValueError, KeyError):
                raise w.fail(f"tensor {name!r} has unknown type {kind}") from None
            n = 1
            for d in shape:
                n *= d
                if d < 1 or n > size * block:  # more elements than the file has bytes for
                    raise w.fail(f"tensor {name!r} of shape {shape} cannot fit in a {size:,}-byte file")
            if shape[0] % block:
                raise w.fail(f"tensor {name!r}'s rows of {shape[0]} are not whole blocks of {block}")
            spans.append((name, offset, n // block * nbytes))
        data = w.at + (-w.at) % alignment
        for name, offset, nbytes in spans:
            if offset % alignment or data + offset + nbytes > size:
                raise w.fail(f"tensor {name!r}'s bytes [{offset:,}, +{nbytes:,}) lie outside the file "
                             f"({size - data:,} bytes of tensor data)")
        check_disjoint(w, spans)


def check_disjoint(w: Walk, spans: list[tuple[str, int, int]]) -> None:
    """No two tensors share bytes: one written over another is two weights read as one (issue
    45: such files loaded and replied nothing)."""
    ordered = sorted(spans, key=lambda s: s[1])
    for (a, start_a, bytes_a), (b, start_b, _) in zip(ordered, ordered[1:], strict=False):
        if start_b < start_a + bytes_a:
            raise w.fail(f"tensors {a!r} and {b!r} share bytes (from offset {start_b:,})")
