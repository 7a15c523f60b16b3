"""KV snapshots: bit-identical round trips (also across processes), only new positions written,
and every bad snapshot (corrupt, truncated, another model's) caught and re-prefilled."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import assert_invariant, assert_transcript, new_keeper, reopen, talk
from safetensors.torch import load_file

from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from chatapp.store.database import ChatStore
from chatapp.store.snapshots import MAX_SEGMENTS
from model.families.llama import RANDOM, LlamaConfig
from model.loading import LoadedModel, LoadOptions, load_model
from model.loading.random import random_model

FIX = Path(__file__).parent / "fixtures" / "nanochat"








def assert_same_cache(a: Session, b: Session):
    pos = a.cache.seqlen
    assert b.cache.seqlen == pos and b.tokens == a.tokens
    assert torch.equal(a.cache.k_cache[:, :, :pos], b.cache.k_cache[:, :, :pos])
    assert torch.equal(a.cache.v_cache[:, :, :pos], b.cache.v_cache[:, :, :pos])
    for name, buf in a.cache.state.items():
        assert torch.equal(buf[:, :pos], b.cache.state[name][:, :pos])


@pytest.fixture
def store(tmp_path):
    s = ChatStore(tmp_path)
    yield s
    s.close()


RESTORE_SCRIPT = """
import json, sys
from safetensors.torch import save_file
from chatapp.keeper.keeper import ChatKeeper
from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from chatapp.store.database import ChatStore
from model.loading import load_model
root, chat_id, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
k = ChatKeeper(Session(load_model("random:tiny"), Settings(), context=1024), ChatStore(root))
r, _ = k.open(chat_id)
c = k.session.cache
save_file({"k": c.k_cache[:, :, :c.seqlen].contiguous(), "v": c.v_cache[:, :, :c.seqlen].contiguous()}, out)
reply = [e for e in k.send("and one more") if getattr(e, "event", "") == "turn"][0].reply
print(json.dumps({"restored": r.restored_tokens, "reprefilled": r.reprefilled_tokens, "reply": reply}))
"""


def test_round_trip_in_a_new_process_is_bit_identical_and_continues_the_same(tiny, store, tmp_path):
    k = new_keeper(tiny, store)
    talk(k, "hello", "tell me more", "and then?")
    out = tmp_path / "restored.safetensors"
    p = subprocess.run([sys.executable, "-c", RESTORE_SCRIPT, str(store.root), str(k.chat_id), str(out)],
                       capture_output=True, timeout=120, check=True)
    child = json.loads(p.stdout)
    pos = k.session.cache.seqlen
    assert child["restored"] == pos and child["reprefilled"] == 0
    got = load_file(str(out))
    assert torch.equal(got["k"], k.session.cache.k_cache[:, :, :pos])
    assert torch.equal(got["v"], k.session.cache.v_cache[:, :, :pos])
    (turn,) = [e for e in k.send("and one more") if getattr(e, "event", "") == "turn"]
    assert child["reply"] == turn.reply  # greedy: the same continuation as the chat that never closed


def test_snapshot_is_the_filled_prefix_and_a_turn_writes_only_its_positions(tiny, store):
    k = new_keeper(tiny, store)
    folder, c = store.snapshot_dir(1), k.session.cache
    sizes = []
    for i in range(4):
        before = c.seqlen
        talk(k, f"message {i}")
        seg = k.writer.segments[-1]
        assert (seg.start, seg.end) == (before, c.seqlen)  # only the new positions
        sizes.append(sum(p.stat().st_size for p in folder.iterdir()))
    overhead = 4096 * len(k.writer.segments)
    assert c.bytes_used <= sizes[-1] <= c.bytes_used + overhead
    assert sizes[-1] < c.bytes_allocated / 4


def test_retry_undo_and_trim_are_rewritten_and_restore_bit_identically(tiny, store):
    k = new_keeper(tiny, store, context=256)
    k.session.settings = Settings(temperature=0.8, seed=3, max_new_tokens=8)
    talk(k, "one", "two")
    steps = [("cmd", "/retry"), ("cmd", "/undo"), ("send", "three"), ("cmd", "/retry"),
             ("send", "x" * 90), ("send", "y" * 90), ("send", "z" * 90)]  # the last ones trim
    for kind, arg in steps:
        events = list(k.run_command(arg) if kind == "cmd" else k.send(arg))
        assert not [e for e in events if getattr(e, "event", "") == "error"], events
        k2, restored = reopen(tiny, store, k.chat_id, context=256)
        assert restored.restored_tokens == k.session.cache.seqlen and restored.reprefilled_tokens == 0
        assert_same_cache(k.session, k2.session)
        assert_transcript(k2.session)
    assert any(getattr(e, "event", "") == "trim" for e in events) or k.session.exchanges[0].user != "one"


def test_many_turns_compact_into_fewer_files(tiny, store):
    k = new_keeper(tiny, store, context=2048)
    talk(k, *[f"m{i}" for i in range(MAX_SEGMENTS + 2)])
    files = list(store.snapshot_dir(k.chat_id).iterdir())
    assert len(files) <= MAX_SEGMENTS
    k2, restored = reopen(tiny, store, k.chat_id, context=2048)
    assert restored.reprefilled_tokens == 0
    assert_same_cache(k.session, k2.session)


def segments(store, chat_id):
    return sorted(p for p in store.snapshot_dir(chat_id).iterdir() if p.suffix == ".safetensors")


def test_corrupt_segment_is_caught_re_prefilled_and_then_replaced(tiny, store):
    k = new_keeper(tiny, store)
    talk(k, "one", "two", "three")
    last = segments(store, k.chat_id)[-1]
    data = bytearray(last.read_bytes())
    data[-100] ^= 0xFF  # one flipped bit pattern inside the tensor data
    last.write_bytes(bytes(data))
    start = int(last.name.split("-")[0])
    k2, r = reopen(tiny, store, k.chat_id)
    assert "corrupt (checksum mismatch)" in r.detail and r.line.startswith(f"restored {start} tokens")
    assert (r.restored_tokens, r.reprefilled_tokens) == (start, k.session.cache.seqlen - start)
    assert_invariant(k2.session)
    k3, r3 = reopen(tiny, store, k.chat_id)  # opening rewrote the bad segment
    assert r3.reprefilled_tokens == 0 and r3.detail == ""
    assert_same_cache(k2.session, k3.session)


def test_truncated_snapshot_re_prefills_everything(tiny, store):
    k = new_keeper(tiny, store)
    talk(k, "one", "two")
    first = segments(store, k.chat_id)[0]
    first.write_bytes(first.read_bytes()[:300])
    k2, r = reopen(tiny, store, k.chat_id)
    assert r.restored_tokens == 0 and r.reprefilled_tokens == k.session.cache.seqlen
    assert "unreadable" in r.detail and r.line.startswith(f"re-prefilled {k.session.cache.seqlen} tokens")
    assert_invariant(k2.session)
    torch.testing.assert_close(k2.session.cache.k_cache[:, :, :k.session.cache.seqlen],
                               k.session.cache.k_cache[:, :, :k.session.cache.seqlen], atol=1e-5, rtol=1e-4)


def test_another_models_snapshot_is_never_loaded(tiny, store):
    k = new_keeper(tiny, store)
    talk(k, "one", "two")
    pos = k.session.cache.seqlen
    other = LoadedModel(random_model(LlamaConfig(**RANDOM.presets["tiny"]), LoadOptions(), seed=1), tiny.tokenizer,
                        tiny.template, "random:tiny-seed1", tiny.context_length)
    k2, r = reopen(other, store, k.chat_id)
    assert r.restored_tokens == 0 and r.reprefilled_tokens == pos
    assert r.detail == "snapshot made by a model with other weights"
    assert k2.session.tokens == k.session.tokens  # same tokenizer: the stored ids are reused
    assert_invariant(k2.session)
    bf16 = load_model("random:tiny", LoadOptions(dtype=torch.bfloat16))
    _, r = reopen(bf16, store, k.chat_id)
    assert r.restored_tokens == 0 and r.detail == "snapshot made in float32, this session runs bfloat16"
    _, r = reopen(bf16, store, k.chat_id)  # the snapshot now belongs to the model that opened it last
    assert r.restored_tokens == pos and r.reprefilled_tokens == 0
    assert store.get(k.chat_id).model == "random:tiny"


@pytest.mark.skipif(not (FIX / "head").is_dir(), reason="nanochat fixtures not present")
def test_nanochat_state_buffers_travel_with_the_snapshot(tiny, store):
    lm = load_model(str(FIX / "head"), LoadOptions(tokenizer=str(FIX / "tokenizer" / "tokenizer.pkl"), attn="sdpa"))
    k = new_keeper(lm, store, context=256)
    talk(k, "What is 2+2?", "And 3+3?")
    assert k.session.cache.state  # the previous-token buffer nanochat's smear reads
    k2, r = reopen(lm, store, k.chat_id, context=256)
    assert r.reprefilled_tokens == 0
    assert_same_cache(k.session, k2.session)
    # a chat from another tokenizer comes back re-tokenized from its text, and says so
    k3, r = reopen(tiny, store, k.chat_id)
    assert r.restored_tokens == 0 and "another tokenizer; re-tokenized" in r.detail
    assert [ex.user for ex in k3.session.exchanges] == ["What is 2+2?", "And 3+3?"]
    assert_transcript(k3.session)
    assert_invariant(k3.session)


def test_truncated_last_segment_is_named(tiny, store):
    k = new_keeper(tiny, store)
    talk(k, "one", "two")
    first, last = segments(store, k.chat_id)
    last.write_bytes(last.read_bytes()[:300])
    k2, r = reopen(tiny, store, k.chat_id)
    start = int(last.name.split("-")[0])
    assert r.restored_tokens == start and r.reprefilled_tokens == k.session.cache.seqlen - start
    assert r.detail == f"snapshot file {last.name} is unreadable (truncated?)"
    assert_invariant(k2.session)


def test_the_next_start_removes_what_a_killed_writer_left(tiny, store, tmp_path):
    """safetensors' save_file writes `.tmpXXXXXX` (tempfile crate) and renames it; our writes
    are `.<segment>.<pid>.tmp`. Whatever a kill left goes when the store next opens; a live
    writer's file stays."""
    k = new_keeper(tiny, store)
    talk(k, "one")
    folder = store.snapshot_dir(k.chat_id)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    ours = folder / f".00000000-00000040.safetensors.{dead}.tmp"
    theirs = folder / ".tmpAb3xZ9"  # as safetensors 0.8 names it, left by an older version
    live = folder / f".00000000-00000050.safetensors.{os.getppid()}.tmp"
    for p in (ours, theirs, live):
        p.write_bytes(b"partial")
    os.utime(theirs, (time.time() - 120, time.time() - 120))  # pid-less: its age says it is dead
    orphan = store.root / "snapshots" / "999"  # a chat deleted before its folder went
    orphan.mkdir()
    (orphan / "00000000-00000010.safetensors").write_bytes(b"x")
    ChatStore(store.root).close()
    assert not ours.exists() and not theirs.exists() and not orphan.exists()
    assert live.exists() and segments(store, k.chat_id)


PEAK = """
import resource, sys, torch
from chatapp.store.identity import ModelIdentity
from chatapp.store.snapshots import write_segment
from kvcache import KVCache
c = KVCache(1, 4, 8192, 64, 64, "cpu", torch.float16)   # 256 MiB of K/V, all of it written
c.k_cache.fill_(1.0); c.v_cache.fill_(2.0); c.advance(8192)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
write_segment(__import__("pathlib").Path(sys.argv[1]), c, 0, 8192, list(range(8192)), ModelIdentity("a", "b", "c", "d"))
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""


def test_a_whole_cache_segment_is_written_without_copying_the_cache(tmp_path):
    """Issue 44: a compaction (every MAX_SEGMENTS turns) copied the whole filled cache twice, as
    contiguous tensors and as safetensors' bytes: 512 MiB of peak for 256 MiB of K/V. Streamed
    from views of the cache, layer by layer, the file reads back exact with safetensors' loader."""
    r = subprocess.run([sys.executable, "-c", PEAK, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert int(r.stdout) < 32 << 20, f"peak grew {int(r.stdout) / 2**20:.0f} MiB"
    (path,) = tmp_path.glob("*.safetensors")
    t = load_file(path)
    assert t["k"].shape == (64, 1, 8192, 4, 64) and bool((t["k"] == 1.0).all()) and bool((t["v"] == 2.0).all())
