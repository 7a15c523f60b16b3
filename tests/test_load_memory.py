"""A GGUF opened and chatted with holds the file's bytes once: peak resident memory (VmHWM) of a
load and a turn, in a fresh process, stays within the memory before the load + the file + the KV
cache in use + a bounded scratch. Converting to a model-sized copy and then copying that into the
huge-page arena held the weights twice (docs/weight-formats.md, "Memory")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFWriter
from gguf import GGMLQuantizationType as Q
from helpers import add_bpe_vocab, add_hparams, close_gguf, llama_hparams, trained_vocab

LAYERS, HIDDEN, FFN, HEADS = 10, 1024, 4096, 8
SCRATCH = 40 << 20   # the step's and the prefill's buffers, the tokenizer, glibc's arenas: measured ~15 MB
# Q4_K and Q6_K are read from the file as they are; Q4_0 (Q/K: unpermuted too) and Q8_0 are
# repacked at load: both ways of making a weight are in the file.
TYPES = {"attn_q": Q.Q4_0, "attn_k": Q.Q4_0, "attn_v": Q.Q8_0, "attn_output": Q.Q6_K, "ffn_gate": Q.Q4_K,
         "ffn_up": Q.Q4_K, "ffn_down": Q.Q8_0}
SCALE_AT = {Q.Q4_0: 0, Q.Q8_0: 0, Q.Q4_K: 0, Q.Q6_K: 208}   # each block's fp16 d


def random_blocks(rows: int, cols: int, kind: Q, rng: np.random.Generator) -> np.ndarray:
    values, size = GGML_QUANT_SIZES[kind]
    raw = rng.integers(0, 256, (rows, cols // values, size), dtype=np.uint8)
    raw[..., SCALE_AT[kind]:SCALE_AT[kind] + 2] = np.frombuffer(np.float16(1e-3).tobytes(), np.uint8)
    if kind == Q.Q4_K:
        raw[..., 2:4] = 0   # dmin
    return raw.reshape(rows, -1)


def write_wide_gguf(path: Path) -> None:
    """A ~90 MB Llama: wide enough that the weights, not the interpreter, set the peak."""
    rng = np.random.default_rng(0)
    model = json.loads(trained_vocab().to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    w = GGUFWriter(str(path), "llama")
    add_hparams(w, "llama", llama_hparams(LAYERS, HIDDEN, FFN, HEADS, HEADS, 256))
    add_bpe_vocab(w, tokens, model["merges"], bos=1, eos=2)
    vocab = len(tokens)
    w.add_tensor("token_embd.weight", random_blocks(vocab, HIDDEN, Q.Q8_0, rng), raw_dtype=Q.Q8_0)
    for i in range(LAYERS):
        for name, kind in TYPES.items():
            rows, cols = (HIDDEN, FFN) if name == "ffn_down" else (FFN, HIDDEN) if name.startswith("ffn") \
                else (HIDDEN, HIDDEN)
            w.add_tensor(f"blk.{i}.{name}.weight", random_blocks(rows, cols, kind, rng), raw_dtype=kind)
        for name in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{i}.{name}.weight", np.ones(HIDDEN, np.float32))
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
    close_gguf(w)


RUN = """
import sys
from pathlib import Path
from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from model.loading import LoadOptions, load_model
import gguf, safetensors, tokenizers, model.loading.gguf  # what the load imports, before the baseline

def status(key):
    line = next(x for x in Path('/proc/self/status').read_text().splitlines() if x.startswith(key))
    return int(line.split()[1]) << 10

base = status('VmRSS:')
lm = load_model(sys.argv[1], LoadOptions(quantized=True))
s = Session(lm, Settings(temperature=0.0, max_new_tokens=8), context=256)
list(s.send('hello world, what is the capital of France?'))
c = s.cache
kv = c.seqlen * c.k_cache[0, 0, 0].numel() * c.k_cache.element_size() * 2 * len(c.k_cache)   # K and V, every layer
print(base, status('VmHWM:'), kv)
"""


def test_peak_memory_of_a_load_and_a_turn_is_the_file_once(tmp_path):
    path = tmp_path / "wide.gguf"
    write_wide_gguf(path)
    size = path.stat().st_size
    r = subprocess.run([sys.executable, "-c", RUN, str(path)], capture_output=True, text=True, timeout=300,
                       env={"NANOCHAT_TUI_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin",
                            "OMP_NUM_THREADS": "2"}, cwd=Path(__file__).parent.parent)
    assert r.returncode == 0, r.stderr[-2000:]
    base, peak, kv = (int(x) for x in r.stdout.split())
    assert size > 2 * SCRATCH   # holding the weights twice could not hide in the scratch allowance
    assert peak - base <= size + kv + SCRATCH, f"peak {(peak - base) >> 20} MB over a {size >> 20} MB file"
