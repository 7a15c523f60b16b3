"""Run the fused Triton decode step in Triton's CPU interpreter against the eager forward.

Started by tests/test_kernels_interpreter.py in a subprocess, because TRITON_INTERPRET must
be set before the kernels are decorated. Prints one JSON line.
"""

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from model.decode.llama_fused import LlamaFusedStep  # noqa: E402
from model.loading import load_model  # noqa: E402


def main(prompts: list[int], spec: str = "random:tiny") -> None:
    m = load_model(spec).model
    with torch.no_grad():  # norms off 1.0, so a weight applied to the wrong head or kind shows
        for name, p in m.named_parameters():
            if "norm" in name:
                p.mul_(1 + 0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
    rows = []
    with torch.inference_mode():
        for n in prompts:
            ids = torch.randint(0, 200, (1, n), generator=torch.Generator().manual_seed(n))
            ref_cache, cache = m.new_cache(2048), m.new_cache(2048)
            m(ids, ref_cache)
            m(ids, cache)
            step = LlamaFusedStep(m, cache, pdl=False, splits=4)
            for token in (7, 11):
                ref = m(torch.tensor([[token]]), ref_cache)[0, -1]
                step.token.fill_(token)
                out = step()[:ref.shape[0]]
                cache.advance(1)
                rows.append(dict(prompt=n, token=token, splits=step.decode_attn.splits, block=step.decode_attn.block_n,
                                 rel_err=float((out - ref).norm() / ref.norm()),
                                 argmax_equal=int(out.argmax()) == int(ref.argmax())))
            k = (cache.k_cache[:, :, :cache.seqlen] - ref_cache.k_cache[:, :, :cache.seqlen]).abs().max()
            v = (cache.v_cache[:, :, :cache.seqlen] - ref_cache.v_cache[:, :, :cache.seqlen]).abs().max()
            rows[-1]["cache_max_diff"] = float(max(k, v))
    print(json.dumps(rows))


def live_splits(keys: int, block: int, splits: int) -> int:
    blocks = -(-keys // block)
    per = -(-blocks // splits)
    return -(-blocks // per)


def attention_edges() -> None:
    """DecodeAttention alone against a float64 softmax at the key-block edges, for head dims
    on both sides of the 128/64-key block switch, with 1 to 24 live splits."""
    from model.decode.decode_attention import DecodeAttention

    rows = []
    g = torch.Generator().manual_seed(0)
    # (head dim, splits, key blocks in the cache): 1-4 splits take the few-splits merge; 32
    # splits over 24 blocks reach 18 and 24 live splits, the many-splits merge.
    cases = [(d, s, 4) for d in (16, 64, 128) for s in (1, 2, 4)] + [(16, 32, 24)]
    for d, splits, blocks in cases:
        att = DecodeAttention(4, 2, d, blocks * 128 + 64, "cpu", splits)
        b = att.block_n
        cap = blocks * b + 64
        k, v = torch.randn(cap, 2, d, generator=g), torch.randn(cap, 2, d, generator=g)
        q = torch.randn(4, d, generator=g)
        for pos in sorted({0, 1, b - 2, b - 1, b, b + 1, 2 * b - 1, 2 * b, 3 * b + 5, 17 * b + 5, cap - 1}):
            if pos >= cap:
                continue
            out = att(q, k, v, torch.tensor([pos], dtype=torch.int32), torch.empty(4 * d)).view(4, d)
            kk, vv = k[:pos + 1].double().repeat_interleave(2, 1), v[:pos + 1].double().repeat_interleave(2, 1)
            p = torch.einsum("hd,thd->ht", q.double(), kk).mul(d ** -0.5).softmax(-1)
            ref = torch.einsum("ht,thd->hd", p, vv)
            rows.append(dict(d=d, splits=att.splits, block=b, pos=pos, live=live_splits(pos + 1, b, att.splits),
                             rel_err=float((out.double() - ref).norm() / ref.norm()),
                             counters_reset=bool((att.count == 0).all())))
    # A sliding window read in place: W keys ending at the new one, W not a multiple of the block.
    for d, splits in ((16, 2), (128, 4)):
        att = DecodeAttention(4, 2, d, 200, "cpu", splits, window=200)
        b, w = att.block_n, 200
        cap = 4 * b + 64
        k, v = torch.randn(cap, 2, d, generator=g), torch.randn(cap, 2, d, generator=g)
        q = torch.randn(4, d, generator=g)
        for pos in (0, w - 2, w - 1, w, w + 1, w + b - 1, cap - 1):
            out = att(q, k, v, torch.tensor([pos], dtype=torch.int32), torch.empty(4 * d)).view(4, d)
            lo = max(0, pos + 1 - w)
            kk, vv = k[lo:pos + 1].double().repeat_interleave(2, 1), v[lo:pos + 1].double().repeat_interleave(2, 1)
            p = torch.einsum("hd,thd->ht", q.double(), kk).mul(d ** -0.5).softmax(-1)
            ref = torch.einsum("ht,thd->hd", p, vv)
            rows.append(dict(d=d, splits=att.splits, block=b, pos=pos, window=w,
                             live=live_splits(pos + 1 - lo, b, att.splits),
                             rel_err=float((out.double() - ref).norm() / ref.norm()),
                             counters_reset=bool((att.count == 0).all())))
    print(json.dumps(rows))


def greedy_cases() -> None:
    """greedy_pick against torch.argmax: ties inside a block and across blocks, the maximum in
    the last partial block, bf16 logits, and the host slot chosen by the position."""
    from model.decode.greedy import BLOCK, greedy_pick

    g = torch.Generator().manual_seed(0)
    rows = []
    for v, dtype, where in ((BLOCK * 3 + 17, torch.float32, "random"), (BLOCK * 3 + 17, torch.float32, "last"),
                            (BLOCK * 2, torch.float32, "tie_across"), (100, torch.float32, "tie_within"),
                            (BLOCK + 5, torch.bfloat16, "random")):
        logits = torch.randn(v, generator=g).to(dtype)
        if where == "last":
            logits[-1] = 50
        elif where == "tie_across":
            logits[BLOCK + 3] = logits[5] = 50
        elif where == "tie_within":
            logits[70] = logits[40] = 50
        token, host = torch.zeros(1, dtype=torch.long), torch.full((64,), -1, dtype=torch.long)
        pos = torch.tensor([37], dtype=torch.int32)
        greedy_pick(logits, pos, token, host)
        rows.append(dict(v=v, case=where, got=int(token[0]), host=int(host[37]), want=int(logits.argmax()),
                         others_untouched=int((host != -1).sum()) == 1))
    print(json.dumps(rows))


def window_cases() -> None:
    """window_attention (prefill over the cache) against a float64 masked softmax: chunks that
    start at 0, inside the first key block and far past the window, windows shorter than a block,
    longer than the chunk and none at all, with the default and with small blocks (more edges)."""
    from kvcache.window_attention import window_attention

    g = torch.Generator().manual_seed(0)
    rows = []
    for d, blocks in ((16, None), (24, (16, 16, 4))):
        cap = 256
        k, v = torch.randn(1, cap, 2, d, generator=g), torch.randn(1, cap, 2, d, generator=g)
        for start, tq, w in ((0, 37, 8), (3, 17, -1), (100, 70, 50), (150, 1, 8), (40, 90, 200), (190, 33, 31)):
            q = torch.randn(1, tq, 4, d, generator=g)
            out = window_attention(q, k, v, torch.tensor([start], dtype=torch.int32), w - 1 if w > 0 else -1,
                                   blocks=blocks)
            qpos = torch.arange(start, start + tq)[:, None]
            kpos = torch.arange(start + tq)[None, :]
            mask = (kpos <= qpos) & ((kpos > qpos - w) if w > 0 else True)
            kk, vv = (t[0, :start + tq].double().repeat_interleave(2, 1) for t in (k, v))
            s = torch.einsum("thd,khd->htk", q[0].double(), kk) * d ** -0.5
            ref = torch.einsum("htk,khd->thd", s.masked_fill(~mask, float("-inf")).softmax(-1), vv)
            rows.append(dict(d=d, blocks=blocks, start=start, tq=tq, window=w,
                             rel_err=float((out[0].double() - ref).norm() / ref.norm())))
    print(json.dumps(rows))


def prefill_cases() -> None:
    """The fused prefill step (model/decode/prefill_fused.py) against the eager forward, fp32: 11
    new tokens in a 16-token bucket after 20 cached ones (5 rows of padding; Gemma's 8-key window
    crossed), norm weights off 1 so a weight on the wrong row or kind shows."""
    from model.decode.prefill_fused import fused_prefill_class
    from model.decode.steps import family_name
    from model.families.llama import LlamaConfig
    from model.loading import LoadOptions
    from model.loading.random import random_model

    # 6 query + 2 key + 2 value heads: 10 head slots in a 16-row tile (SmolLM2 has 15)
    odd = random_model(LlamaConfig(vocab_size=512, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=128),
                       LoadOptions())
    rows = []
    for spec in ("random:tiny", "random:tiny-qwen2", "random:tiny-gemma3", "heads-6-2"):
        m = odd if spec == "heads-6-2" else load_model(spec).model
        with torch.no_grad():
            for name, p in m.named_parameters():
                if "norm" in name:
                    p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
        g = torch.Generator().manual_seed(3)
        hist, new = torch.randint(1, 200, (1, 20), generator=g), torch.randint(1, 200, (11,), generator=g)
        ref, cache = m.new_cache(64), m.new_cache(64)
        with torch.inference_mode():
            m(hist, ref)
            m(hist, cache)
            want = m(new[None], ref, last=True)[0, -1]
            buf = torch.randint(1, 200, (1, 16), generator=g)
            buf[0, :11] = new
            logits = torch.zeros(m.config.vocab_size)
            cache.k_cache[:, :, 20:] = 7.0   # a sentinel: what the step writes shows, and where
            cache.v_cache[:, :, 20:] = 7.0
            step = fused_prefill_class(m, family_name(m))(m, cache, buf, torch.tensor([10]), logits)
            got = step().clone()
            beyond = bool((cache.k_cache[:, :, 36:] == 7).all() and (cache.v_cache[:, :, 36:] == 7).all())
            written = bool((cache.k_cache[:, :, 31:36] != 7).all() and (cache.v_cache[:, :, 31:36] != 7).all())
            cache.advance(11)
            nxt = torch.tensor([[7]])
            after = m(nxt, cache)[0, -1]
            after_ref = m(nxt, ref)[0, -1]
        kv = max(float((a[:, :, :31] - b[:, :, :31]).abs().max())
                 for a, b in ((cache.k_cache, ref.k_cache), (cache.v_cache, ref.v_cache)))
        rows.append(dict(spec=spec, step=type(step).__name__, rel_err=float((got - want).norm() / want.norm()),
                         kv_max_diff=kv, next_rel_err=float((after - after_ref).norm() / after_ref.norm()),
                         padding_written=written, beyond_untouched=beyond))
    print(json.dumps(rows))


if __name__ == "__main__":
    if sys.argv[1:] == ["prefill"]:
        prefill_cases()
    elif sys.argv[1:] == ["window"]:
        window_cases()
    elif sys.argv[1:] == ["attention"]:
        attention_edges()
    elif sys.argv[1:] == ["greedy"]:
        greedy_cases()
    elif sys.argv[1] == "--model":
        main([int(a) for a in sys.argv[3:]], sys.argv[2])
    else:
        main([int(a) for a in sys.argv[1:]])
