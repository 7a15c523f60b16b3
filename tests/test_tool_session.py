"""The calculator tool end to end: a real (tiny) nanochat model calls it, the session forces
<|output_start|>result<|output_end|> through the model into the cache, and the cache still
holds exactly the conversation's tokens.

The model is a HEAD-generation Nanochat with random weights, steered into a script: the
token embeddings of the script are orthogonal and lm_head maps each one to its successor,
so greedy decoding plays the script while attention, value embeddings, smear and backout
still run (scaled down) and write the cache.
"""


import pytest
from helpers import assert_invariant, scripted

from chatapp.chat.events import ToolCall, TurnStats, to_json
from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from chatapp.keeper.keeper import ChatKeeper


@pytest.fixture(scope="module")
def calc_model():
    return scripted("12*7", " ok")


def test_tool_call_forces_output_through_the_cache(calc_model):
    s = Session(calc_model, Settings(temperature=0.0, max_new_tokens=40, system="Be terse."))
    t, tokenizer = s.template, s.tokenizer
    events = list(s.send("What is 12*7?"))
    calls = [e for e in events if isinstance(e, ToolCall)]
    (st,) = [e for e in events if isinstance(e, TurnStats)]
    assert calls == [ToolCall("12*7", "84")] and st.tool_calls == calls and st.stop == "end"
    tt = t.tool_tokens
    ex = s.exchanges[0]
    assert s.tokens[:ex.reply_start] == [t.bos_id, t.user_start, *tokenizer.encode("Be terse.\n\nWhat is 12*7?"),
                                         t.user_end, t.assistant_start]
    assert s.tokens[ex.reply_start:] == [tt["python_start"], *tokenizer.encode("12*7"), tt["python_end"],
                                         tt["output_start"], *tokenizer.encode("84"), tt["output_end"],
                                         *tokenizer.encode(" ok"), t.assistant_end]
    assert ex.reply.endswith("<|output_start|>84<|output_end|> ok")
    assert_invariant(s)
    assert to_json(st)["tool_calls"] == [{"expr": "12*7", "result": "84"}]

    # The next turn prefills only its own tokens on top of the forced ones.
    pos = s.cache.seqlen
    events = list(s.send("Again?"))
    (st2,) = [e for e in events if isinstance(e, TurnStats)]
    assert st2.cached_before == pos
    assert st2.prefill_tokens == 1 + len(t.user_turn("Again?"))  # the pending <|assistant_end|> + the turn
    assert st2.tool_calls == [ToolCall("12*7", "84")]
    assert_invariant(s)

    # /retry rewinds over the forced tokens and replays the same call.
    before = list(s.tokens)
    list(ChatKeeper(s, None).run_command("/retry"))
    assert s.tokens == before
    assert_invariant(s)


def test_invalid_expression_forces_nothing():
    s = Session(scripted("1/0", " ok"), Settings(temperature=0.0, max_new_tokens=40))
    events = list(s.send("Divide."))
    assert [e for e in events if isinstance(e, ToolCall)] == [ToolCall("1/0", None)]
    t, tokenizer = s.template, s.tokenizer
    reply = s.tokens[s.exchanges[0].reply_start:]
    assert t.tool_tokens["output_start"] not in reply
    assert reply == [t.tool_tokens["python_start"], *tokenizer.encode("1/0"), t.tool_tokens["python_end"],
                     *tokenizer.encode(" ok"), t.assistant_end]
    assert_invariant(s)
