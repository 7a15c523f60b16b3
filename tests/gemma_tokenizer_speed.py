"""Gemma 3's tokenizer (the real 262k vocabulary) through our loader's SentencePiece tokenizer: MB/s."""
import json
import sys
import time
from pathlib import Path

from model.tokenizers.spm import spm_from_json

path = Path(sys.argv[1])
text = path.read_text()
tok = spm_from_json(path, text, json.loads(text), {})
base = Path("README.md").read_text() + Path("docs/notes.md").read_text() + "日本語のテキストと絵文字 🙂 も少し。\n"
for label, sample in (("2 KB messages", [base[i:i + 2048] for i in range(0, len(base) - 2048, 2048)]),
                      ("256 KB paste", [(base * 8)[: 256 * 1024]])):
    n = sum(len(s.encode()) for s in sample)
    best = 1e9
    for _ in range(3):
        t0 = time.perf_counter()
        for s in sample:
            tok.encode(s)
        best = min(best, time.perf_counter() - t0)
    print(f"gemma3 {label}: {n / best / 1e6:.2f} MB/s ({n} bytes)")
