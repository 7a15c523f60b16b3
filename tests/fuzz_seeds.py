"""The valid files tests/test_fuzz.py mutates: a small Llama GGUF with a byte-level vocabulary
(written with gguf.GGUFWriter), the tokenizer.json and config.json it converts to, the vendors'
chat templates, and a store holding one chat made by random:tiny."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"


def byte_alphabet() -> list[str]:
    """GPT-2's byte-to-character map: printable bytes stand for themselves, the rest move past 255."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def write_seed_gguf(path: Path) -> None:
    from gguf import GGUFWriter

    tokens = byte_alphabet() + ["he", "ll", "hell", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    w = GGUFWriter(str(path), "llama")
    for key, value in {"block_count": 1, "context_length": 128, "embedding_length": 8, "feed_forward_length": 16,
                       "attention.head_count": 2, "attention.head_count_kv": 1}.items():
        w.add_uint32(f"llama.{key}", value)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3 if t.startswith("<|") else 1 for t in tokens])
    w.add_token_merges(["h e", "l l", "he ll"])
    w.add_bos_token_id(len(tokens) - 3)
    w.add_eos_token_id(len(tokens) - 1)
    w.add_chat_template((TEMPLATES / "HuggingFaceTB-SmolLM2-135M-Instruct.jinja").read_text())
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.normal(size=(len(tokens), 8)).astype(np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(8, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def seed_store(root: Path, lm) -> Path:
    from chatapp.chat.session import Session
    from chatapp.chat.settings import Settings
    from chatapp.keeper.keeper import ChatKeeper
    from chatapp.store.database import ChatStore

    store = ChatStore(root)
    k = ChatKeeper(Session(lm, Settings(temperature=0.0, max_new_tokens=3), context=256), store)
    for text in ("hello there", "and again"):
        list(k.send(text))
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    return root / "chats.db"


def seed_files(d: Path, lm) -> dict:
    from model.loading.gguf_meta import hf_config, open_gguf, tokenizer_files

    gguf = d / "seed.gguf"
    write_seed_gguf(gguf)
    g = open_gguf(gguf)
    tok, _cfg = tokenizer_files(g)
    (d / "tokenizer.json").write_text(json.dumps(tok))
    (d / "config.json").write_text(json.dumps(hf_config(g, "seed")))
    (d / "store").mkdir()
    return {"gguf": gguf, "tokenizer": d / "tokenizer.json", "config": d / "config.json",
            "templates": sorted(TEMPLATES.glob("*.jinja")), "row": seed_store(d / "store", lm)}
