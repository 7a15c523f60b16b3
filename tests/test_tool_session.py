"""The calculator tool end to end: a real (tiny) nanochat model calls it, the session forces
<|output_start|>result<|output_end|> through the model into the cache, and the cache still
holds exactly the conversation's tokens.

The model is a HEAD-generation Nanochat with random weights, steered into a script: the
token embeddings of the script are orthogonal and lm_head maps each one to its successor,
so greedy decoding plays the script while attention, value embeddings, smear and backout
still run (scaled down) and write the cache.
"""

from pathlib import Path

import pytest
import torch

from chatapp.chat.events import ToolCall, TurnStats, to_json
from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from chatapp.keeper.keeper import ChatKeeper
from kvcache import Attention
from model.chat_formats.templates import NanochatFormat
from model.families.nanochat import Nanochat
from model.families.nanochat_config import NanochatConfig
from model.loading import LoadedModel
from model.tokenizers.safe_pickle import load_encoding
from model.tokenizers.tokenizer import Tokenizer

TOKENIZER = Path(__file__).parent / "fixtures" / "nanochat" / "tokenizer" / "tokenizer.pkl"


def scripted(expr: str, after: str) -> LoadedModel:
    """Replies <|python_start|>expr<|python_end|>, then (after any tool output) `after`."""
    tok = Tokenizer(load_encoding(TOKENIZER), bos="<|bos|>")
    t = NanochatFormat(tok)
    tt = t.tool_tokens
    call = [t.assistant_start, tt["python_start"], *tok.encode(expr), tt["python_end"]]
    tail = [*tok.encode(after), t.assistant_end]
    edges = list(zip(call, call[1:], strict=False)) + list(zip(tail, tail[1:], strict=False))
    edges += [(tt["python_end"], tail[0]), (tt["output_end"], tail[0])]
    nodes = sorted({a for a, _ in edges})
    assert len(set(call + tail)) == len(call + tail), "script tokens must be distinct"

    cfg = NanochatConfig.for_generation("2026-03-14", sequence_len=256, vocab_size=300, padded_vocab_size=320,
                                        n_layer=2, n_head=2, n_kv_head=1, n_embd=32)
    torch.manual_seed(0)
    model = Nanochat(cfg, Attention("sdpa"))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
        for block in model.transformer.h:  # keep the residual stream close to the embedding
            block.attn.c_proj.weight.mul_(0.05)
            block.mlp.c_proj.weight.mul_(0.05)
        model.resid_lambdas.fill_(1.0)
        model.x0_lambdas.fill_(0.1)
        model.smear_lambda.fill_(0.1)
        model.backout_lambda.fill_(0.1)
        basis = torch.linalg.qr(torch.randn(cfg.n_embd, cfg.n_embd))[0].T * cfg.n_embd ** 0.5
        for i, a in enumerate(nodes):
            model.transformer.wte.weight[a] = basis[i]
        model.lm_head.weight.zero_()
        for a, b in edges:
            model.lm_head.weight[b] += 4.0 * basis[nodes.index(a)] / cfg.n_embd ** 0.5
    model.eval()
    return LoadedModel(model, tok, t, "scripted nanochat", cfg.sequence_len)


def assert_cache_holds_tokens(s: Session):
    """K/V (and so the smear state feeding them) equal a fresh prefill of tokens[:pos]."""
    pos = s.cache.seqlen
    fresh = s.lm.model.new_cache(s.cache.capacity)
    with torch.no_grad():
        s.lm.model(torch.tensor([s.tokens[:pos]]), fresh)
    torch.testing.assert_close(s.cache.k_cache[:, :, :pos], fresh.k_cache[:, :, :pos], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(s.cache.v_cache[:, :, :pos], fresh.v_cache[:, :, :pos], atol=1e-5, rtol=1e-4)


@pytest.fixture(scope="module")
def calc_model():
    return scripted("12*7", " ok")


def test_tool_call_forces_output_through_the_cache(calc_model):
    s = Session(calc_model, Settings(temperature=0.0, max_new_tokens=40, system="Be terse."))
    t, tok = s.template, s.tok
    events = list(s.send("What is 12*7?"))
    calls = [e for e in events if isinstance(e, ToolCall)]
    (st,) = [e for e in events if isinstance(e, TurnStats)]
    assert calls == [ToolCall("12*7", "84")] and st.tool_calls == calls and st.stop == "end"
    tt = t.tool_tokens
    ex = s.exchanges[0]
    assert s.tokens[:ex.reply_start] == [t.bos_id, t.user_start, *tok.encode("Be terse.\n\nWhat is 12*7?"),
                                         t.user_end, t.assistant_start]
    assert s.tokens[ex.reply_start:] == [tt["python_start"], *tok.encode("12*7"), tt["python_end"],
                                         tt["output_start"], *tok.encode("84"), tt["output_end"],
                                         *tok.encode(" ok"), t.assistant_end]
    assert ex.reply.endswith("<|output_start|>84<|output_end|> ok")
    assert_cache_holds_tokens(s)
    assert to_json(st)["tool_calls"] == [{"expr": "12*7", "result": "84"}]

    # The next turn prefills only its own tokens on top of the forced ones.
    pos = s.cache.seqlen
    events = list(s.send("Again?"))
    (st2,) = [e for e in events if isinstance(e, TurnStats)]
    assert st2.cached_before == pos
    assert st2.prefill_tokens == 1 + len(t.user_turn("Again?"))  # the pending <|assistant_end|> + the turn
    assert st2.tool_calls == [ToolCall("12*7", "84")]
    assert_cache_holds_tokens(s)

    # /retry rewinds over the forced tokens and replays the same call.
    before = list(s.tokens)
    list(ChatKeeper(s, None).run_command("/retry"))
    assert s.tokens == before
    assert_cache_holds_tokens(s)


def test_invalid_expression_forces_nothing():
    s = Session(scripted("1/0", " ok"), Settings(temperature=0.0, max_new_tokens=40))
    events = list(s.send("Divide."))
    assert [e for e in events if isinstance(e, ToolCall)] == [ToolCall("1/0", None)]
    t, tok = s.template, s.tok
    reply = s.tokens[s.exchanges[0].reply_start:]
    assert t.tool_tokens["output_start"] not in reply
    assert reply == [t.tool_tokens["python_start"], *tok.encode("1/0"), t.tool_tokens["python_end"],
                     *tok.encode(" ok"), t.assistant_end]
    assert_cache_holds_tokens(s)
