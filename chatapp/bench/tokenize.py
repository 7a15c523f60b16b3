"""`nanochat-tui bench --tokenizers DIR`: how fast each tokenizer family encodes, in MB/s of UTF-8.

DIR holds GGUF vocabularies (llama.cpp's models/ggml-vocab-*.gguf: tests/llama_vocab.py caches
them in ~/.cache/nanochat-tui-tests/llama-vocab-0.3.36). Each is built the way the app builds a
GGUF's tokenizer (the canonical tokenizer.json, then model/tokenizers/bpe.py or model/tokenizers/spm.py) and encodes
the same text as user messages of about 2 KB and as one 256 KB paste. The `tokenizers` library
on the same tokenizer.json is the peer, timed in the same run (the ratio is what carries over;
absolute MB/s on a shared machine do not).
"""

from __future__ import annotations

import json
import tempfile
import time
from functools import partial
from pathlib import Path

SAMPLE = Path(__file__).resolve().parents[2] / "docs"
TARGET_MB_S = 1.0


def sample_text() -> str:
    """Prose, tables and code: the project's own docs (what a user pastes is much like it)."""
    files = sorted(SAMPLE.glob("*.md"))
    text = "\n\n".join(f.read_text(encoding="utf-8") for f in files) if files else ""
    return text or ("The quick brown fox jumps over the lazy dog. 12345 + 678 = 13023;\n" * 400)


def _rate(encode, texts: list[str]) -> float:
    size = sum(len(t.encode()) for t in texts)
    best = float("inf")
    for _ in range(3):   # best of three: the machine is shared
        t0 = time.perf_counter()
        for t in texts:
            encode(t)
        best = min(best, time.perf_counter() - t0)
    return size / best / 1e6


def build(vocab: Path, tmp: Path):
    """(our tokenizer, the `tokenizers` peer) for one GGUF vocabulary."""
    from tokenizers import Tokenizer as HFTokenizer

    from model.loading.gguf_fast import FastReader
    from model.loading.gguf_meta import GGUFFile, tokenizer_files
    from model.tokenizers.bpe import tokenizer_from_json

    reader = FastReader(vocab)
    tok_json, config = tokenizer_files(GGUFFile(vocab, reader, reader.values))
    path = tmp / vocab.stem / "tokenizer.json"
    path.parent.mkdir()
    path.write_text(json.dumps(tok_json), encoding="utf-8")
    peer = HFTokenizer.from_file(str(path))
    peer.encode_special_tokens = True
    return tokenizer_from_json(path, config), peer


def tokenizer_speed(folder: str) -> list[dict]:
    vocabs = sorted(Path(folder).expanduser().glob("ggml-vocab-*.gguf"))
    if not vocabs:
        from model.errors import UserError
        raise UserError(f"--tokenizers {folder}: no ggml-vocab-*.gguf files there")
    text = sample_text()
    messages = [text[i:i + 2000] for i in range(0, len(text), 2000)]
    paste = [(text * (256_000 // max(len(text), 1) + 1))[:256_000]]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for vocab in vocabs:
            try:
                ours, peer = build(vocab, Path(tmp))
            except Exception as e:   # a vocabulary the app refuses: say so, go on with the rest
                rows.append({"vocab": vocab.stem, "error": str(e).splitlines()[0][:120]})
                continue
            row = {"vocab": vocab.stem.removeprefix("ggml-vocab-"), "kind": type(ours).__name__}
            peer_encode = partial(peer.encode, add_special_tokens=False)
            for label, texts in (("messages", messages), ("paste", paste)):
                row[f"ours_{label}_mb_s"] = round(_rate(ours.encode, texts), 2)
                row[f"tokenizers_{label}_mb_s"] = round(_rate(peer_encode, texts), 2)
            row["meets_target"] = min(row["ours_messages_mb_s"], row["ours_paste_mb_s"]) >= TARGET_MB_S
            rows.append(row)
    return rows


def print_tokenizer_speed(rows: list[dict]) -> None:
    print(f"tokenizer speed, MB/s of UTF-8 (target >= {TARGET_MB_S}): ours / tokenizers on the same tokenizer.json")
    print(f"{'vocab':<16} {'kind':<14} {'2 KB messages':>20} {'256 KB paste':>20}")
    for r in rows:
        if "error" in r:
            print(f"{r['vocab']:<16} refused: {r['error']}")
            continue
        msg = f"{r['ours_messages_mb_s']:.2f} / {r['tokenizers_messages_mb_s']:.2f}"
        paste = f"{r['ours_paste_mb_s']:.2f} / {r['tokenizers_paste_mb_s']:.2f}"
        print(f"{r['vocab']:<16} {r['kind']:<14} {msg:>20} {paste:>20}")
