"""The bench's readable tables and its one-line JSON summary."""

from __future__ import annotations

from chatapp.bench.profile import print_profile


def _row(cells: list[str], widths: list[int]) -> str:
    return "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=False))


def print_multiturn(mt: dict) -> None:
    print(f"multi-turn: {mt['turns']} turns, {mt['reply_tokens']}-token greedy replies "
          f"({mt['history_at_last_turn']} tokens of history at the last turn)")
    w = [5, 8, 9, 9, 9, 9, 9, 9]
    print(_row(["turn", "history", "prefill", "TTFT ms", "tok/s", "prefill", "TTFT ms", "tok/s"], w)
          + "   (persistent | re-prefill)")
    for a, b in zip(mt["persistent"], mt["reprefill"], strict=True):
        print(_row([str(a["turn"]), str(a["history"]), str(a["prefill_tokens"]), f"{a['ttft_ms']:.1f}",
                    f"{a['decode_tok_s']:.0f}", str(b["prefill_tokens"]), f"{b['ttft_ms']:.1f}",
                    f"{b['decode_tok_s']:.0f}"], w))
    print(f"last-turn TTFT: {mt['last_ttft_vs_first']:.2f}x turn 1 (target <= 1.3x); "
          f"{mt['last_speedup_vs_reprefill']:.1f}x faster than re-prefill (target >= 5x); "
          f"{mt['same_replies']}/{mt['turns']} replies identical in both runs")


def print_decode(title: str, rows: list[dict]) -> None:
    w = [30, 8, 9, 9, 7]
    print(_row([title, "context", "TPOT ms", "tok/s", "MBU"], w))
    for r in rows:
        if "skipped" in r:
            print(_row([r.get("engine", ""), "-", "-", "-", "-"], w) + f"  skipped: {r['skipped']}")
            continue
        print(_row([r.get("engine", ""), str(r["context"]), f"{r['tpot_ms']:.3f}", f"{r['tok_s']:.0f}",
                    f"{100 * r['mbu']:.1f}%"], w))


def print_model(res: dict) -> None:
    print()
    print(f"== {res['model']} on {res['device']} ({res['dtype']}), decode engine {res['decode_engine']}, "
          f"attention {res['backend']}, {res['weight_bytes_per_token'] / 1e6:.0f} MB of weights read per token ==")
    if res["note"]:
        print(f"note: {res['note']}")
    print_multiturn(res["multiturn"])
    print_decode("decode (" + res["decode_engine"] + ")", res["decode"])
    for name, rows in res.get("variants", {}).items():
        print_decode(name, rows)
    if "profile" in res:
        pr = res["profile"]
        print_profile(f"at context {pr['context']}", pr["graph_step_us"], pr["kernels"])
    if "resume" in res:
        print("resume (chatapp.bench.resume): " + ", ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                                                          for k, v in res["resume"].items()))
    peer = res.get("peer")
    if peer and "tok_s" in peer:
        print(f"peer: transformers generate, static cache: {peer['tok_s']:.0f} tok/s; ours "
              f"{peer['ours_tok_s']:.0f} tok/s = {peer['ratio']:.1f}x")
    elif peer:
        print(f"peer: skipped ({peer.get('skipped')})")


def summary_line(device: str, peak: float, results: list[dict]) -> dict:
    """The JSON printed last: every per-turn row, decode row and ratio, keyed by model."""
    return {"bench": "nanochat-tui", "device": device, "peak_bandwidth_gbs": round(peak / 1e9, 1),
            "models": results}
