"""The resume benchmark runs end to end on a tiny model and checks its own claims."""

from chatapp.bench.resume import bench_resume


def test_bench_resume_on_a_tiny_chat(tiny):
    r = bench_resume(tiny, chat_tokens=300, max_new_tokens=4)
    snap, pre, never = r["snapshot"], r["reprefill"], r["never_closed"]
    assert r["chat_tokens"] >= 300 and snap["restored_tokens"] == r["chat_tokens"]
    assert pre["reprefilled_tokens"] == r["chat_tokens"]
    assert snap["bit_identical"] and snap["same_reply"] and pre["same_reply"]
    # after a snapshot resume the first turn prefills only the new message, like the never-closed chat
    assert snap["prefill_tokens"] == never["prefill_tokens"] == pre["prefill_tokens"] < 100
    assert 0 < r["snapshot_bytes"] < 2 * r["chat_tokens"] * 512  # tiny: 512 bytes of K/V per token
    assert set(r["ratios"]) == {"snapshot_ttft", "snapshot_open_to_first_token", "reprefill_open_to_first_token"}
