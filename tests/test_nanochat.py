"""nanochat models of every generation against logits nanochat's own code produced.

The fixtures (tests/fixtures/nanochat, see tests/fixtures/README.md) are tiny checkpoints
made by nanochat's gpt.py at four commits, with the logits its forward gave for 160 tokens
of a real rendered chat. 160 tokens are past every sliding window in them.
"""

import json
from functools import cache
from pathlib import Path

import pytest
import torch

from model.families.nanochat import TOKENS_STATE
from model.families.nanochat_config import NanochatConfig
from model.loading import LoadOptions, load_model

FIX = Path(__file__).parent / "fixtures" / "nanochat"
TOKENIZER = FIX / "tokenizer" / "tokenizer.pkl"
GENERATIONS = {"oct2025": "2025-10", "jan2026": "2026-01", "mar2026a": "2026-03-09", "head": "2026-03-14"}


@cache
def loaded(name: str):
    return load_model(str(FIX / name), LoadOptions(tokenizer=str(TOKENIZER), attn="sdpa"))


def golden(name: str) -> dict:
    return torch.load(FIX / name / "golden.pt", weights_only=True)


def full_forward(model, ids: torch.Tensor, capacity: int = 192) -> torch.Tensor:
    with torch.no_grad():
        return model(ids[None], model.new_cache(capacity))[0]


@pytest.mark.parametrize("name", GENERATIONS)
def test_logits_match_nanochat(name):
    lm, g = loaded(name), golden(name)
    assert lm.model.config.generation == GENERATIONS[name]
    diff = (full_forward(lm.model, g["ids"]) - g["logits"]).abs().max().item()
    assert diff <= 1e-4, f"{name}: max |logit - nanochat's| = {diff}"


def incremental(model, ids: torch.Tensor, capacity: int = 192) -> torch.Tensor:
    """A multi-turn feed: chunks on top of a non-empty cache, single-token decodes, and a
    retry that rewinds over tokens that were fed and feeds different ones."""
    cache = model.new_cache(capacity)
    out = torch.empty(len(ids), model.config.vocab_size)

    def feed(a: int, b: int, tokens: torch.Tensor | None = None):
        x = ids[a:b] if tokens is None else tokens
        with torch.no_grad():
            out[a:b] = model(x[None], cache)[0]

    feed(0, 30)
    for i in range(30, 40):
        feed(i, i + 1)
    feed(40, 95)
    wrong = torch.flip(ids[85:100], [0])  # a reply we take back
    cache.rewind(85)
    feed(85, 100, wrong)
    cache.rewind(85)
    feed(85, 131)
    for i in range(131, 140):
        feed(i, i + 1)
    feed(140, 150)
    feed(150, len(ids))
    assert cache.seqlen == len(ids)
    return out


@pytest.mark.parametrize("name", GENERATIONS)
def test_incremental_feed_matches_full_forward(name):
    lm, g = loaded(name), golden(name)
    inc = incremental(lm.model, g["ids"])
    assert (inc - full_forward(lm.model, g["ids"])).abs().max().item() <= 1e-4
    assert (inc - g["logits"]).abs().max().item() <= 1e-4


def test_smear_is_needed_for_a_chunk_on_a_non_empty_cache():
    """The check above can fail: forgetting the token before a chunk changes its logits."""
    model, ids = loaded("head").model, golden("head")["ids"]
    cache = model.new_cache(192)
    with torch.no_grad():
        model(ids[None, :50], cache)
        cache.state[TOKENS_STATE][:, 49] = (ids[49] + 1) % model.config.vocab_size
        chunk = model(ids[None, 50:60], cache)[0]
    assert (chunk[0] - golden("head")["logits"][50]).abs().max().item() > 1e-3


def test_windows_cut_attention_past_them():
    """Sliding windows matter at 160 tokens: with every layer full, the logits move."""
    lm, g = loaded("jan2026"), golden("jan2026")
    model = lm.model
    saved = model.window_lefts
    model.window_lefts = [-1] * len(saved)
    try:
        full = full_forward(model, g["ids"])
    finally:
        model.window_lefts = saved
    assert (full - g["logits"]).abs().max().item() > 1e-3


@pytest.mark.parametrize("generation, lefts", [
    ("2025-10", [-1, -1, -1, -1]),
    ("2026-01", [1024, 1024, 1024, 2048]),
    ("2026-03-09", [768, 768, 768, 2048]),
    ("2026-03-14", [512, 512, 512, 2048]),
])
def test_window_sizes_of_each_generation(generation, lefts):
    cfg = NanochatConfig.for_generation(generation, sequence_len=2048, n_layer=4, window_pattern="SSSL")
    assert cfg.window_lefts() == lefts


def test_template_matches_nanochat_render_conversation():
    """Our pieces, put together, give the ids nanochat's render_conversation gave."""
    conv = json.loads((FIX / "conversation.json").read_text())["messages"]
    want = json.loads((FIX / "render.json").read_text())["ids"]
    lm = loaded("head")
    t, tok = lm.template, lm.tokenizer
    system, msgs = conv[0]["content"], conv[1:]
    ids = t.start(system)
    for i in range(0, len(msgs), 2):
        ids += t.user_turn(msgs[i]["content"], system if i == 0 else "")
        reply = msgs[i + 1]["content"]
        parts = [{"type": "text", "text": reply}] if isinstance(reply, str) else reply
        for p in parts:
            body = tok.encode(p["text"])
            if p["type"] == "python":
                body = [t.tool_tokens["python_start"], *body, t.tool_tokens["python_end"]]
            elif p["type"] == "python_output":
                body = [t.tool_tokens["output_start"], *body, t.tool_tokens["output_end"]]
            ids += body
        ids += t.end_reply()
    assert ids == want


def test_generation_step_by_step_equals_greedy_over_full_forward():
    """Greedy decoding with the cache picks what a full forward over the prefix picks."""
    lm = loaded("head")
    model, ids = lm.model, golden("head")["ids"][:40].tolist()
    cache = model.new_cache(128)
    with torch.no_grad():
        logits = model(torch.tensor([ids]), cache)[0, -1]
        for _ in range(8):
            nxt = int(logits.argmax())
            ref = model(torch.tensor([ids]), model.new_cache(128))[0, -1]
            assert int(ref.argmax()) == nxt
            ids.append(nxt)
            logits = model(torch.tensor([[nxt]]), cache)[0, -1]


def test_bfloat16_runs_close_to_fp32():
    lm = load_model(str(FIX / "head"), LoadOptions(tokenizer=str(TOKENIZER), dtype=torch.bfloat16, attn="sdpa"))
    g = golden("head")
    out = full_forward(lm.model, g["ids"])
    assert out.dtype == torch.float32 and lm.model.lm_head.weight.dtype == torch.bfloat16
    assert (out - g["logits"]).abs().mean().item() < 0.2
    assert (out.argmax(-1) == g["logits"].argmax(-1)).float().mean().item() > 0.8


def test_overflow_leaves_cache_and_smear_state_untouched():
    model, ids = loaded("head").model, golden("head")["ids"]
    cache = model.new_cache(40)
    with torch.no_grad():
        model(ids[None, :30], cache)
        state = cache.state[TOKENS_STATE].clone()
        with pytest.raises(RuntimeError, match="full"):
            model(ids[None, 30:50], cache)
    assert cache.seqlen == 30 and torch.equal(cache.state[TOKENS_STATE], state)
