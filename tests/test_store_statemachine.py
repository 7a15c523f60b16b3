"""A hypothesis state machine over send, retry, undo, reset, save, load (a restart) and trim.

After every step: the cache equals a fresh fp32 prefill of the session's tokens (the invariant),
and the store holds exactly the session's conversation. A load from the snapshot gives back a
bit-identical cache. Set HYPOTHESIS_EXAMPLES for a longer run.
"""

import os
import shutil
import tempfile
from pathlib import Path

import torch
from helpers import assert_invariant, assert_transcript
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from chatapp.keeper.keeper import ChatKeeper
from chatapp.keeper.reopen import stored_conversation, trimmed_exchanges
from chatapp.store.database import ChatStore
from model.loading import load_model

LM = load_model("random:tiny")  # one model for every machine hypothesis builds
CONTEXT = 256                    # small, so long messages make the session trim


def drain(events) -> list:
    return list(events)


class ChatMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="nanochat-sm-"))
        self.store = ChatStore(self.dir)
        self.keeper = self.new_keeper()

    def new_keeper(self) -> ChatKeeper:
        return ChatKeeper(Session(LM, Settings(temperature=0.0, max_new_tokens=6), context=CONTEXT), self.store)

    @property
    def session(self) -> Session:
        return self.keeper.session

    @initialize(text=st.text(alphabet="abxyz", min_size=1, max_size=8))
    def first_turn(self, text):
        """Every run starts with a stored chat, so short runs still retry, undo and reload it."""
        drain(self.keeper.send(text))

    @rule(text=st.text(alphabet="abxyz ?", min_size=1, max_size=20))
    def send(self, text):
        drain(self.keeper.send(text))

    @rule(n=st.integers(70, 110))
    def trim(self, n):
        """A long message: the oldest exchanges go and the rest is re-prefilled."""
        drain(self.keeper.send("t" * n))

    @rule(cmd=st.sampled_from(["/retry", "/undo", "/reset"]))
    def command(self, cmd):
        drain(self.keeper.run_command(cmd))

    @rule(title=st.sampled_from(["", "named"]))
    def save(self, title):
        drain(self.keeper.run_command(f"/save {title}".strip()))

    @precondition(lambda self: self.keeper.chat_id is not None)
    @rule()
    def load_after_restart(self):
        """A new process, in effect: a fresh session and keeper open the chat from disk."""
        old = self.session
        k = self.new_keeper()
        restored, errors = k.open(self.keeper.chat_id)
        assert not errors
        pos = old.cache.seqlen
        assert (restored.restored_tokens, restored.reprefilled_tokens) == (pos, 0)
        assert k.session.tokens == old.tokens and k.session.cache.seqlen == pos
        assert torch.equal(k.session.cache.k_cache[:, :, :pos], old.cache.k_cache[:, :, :pos])
        assert torch.equal(k.session.cache.v_cache[:, :, :pos], old.cache.v_cache[:, :, :pos])
        self.keeper = k

    @precondition(lambda self: len(self.store.list()) > 1)
    @rule()
    def load_other(self):
        drain(self.keeper.run_command("/load"))

    @invariant()
    def cache_is_a_fresh_prefill(self):
        assert_invariant(self.session)
        assert_transcript(self.session)

    @invariant()
    def store_equals_session(self):
        s = self.session
        if self.keeper.chat_id is None:
            assert not s.exchanges  # only an empty new chat is not stored yet
            return
        chat = self.store.get(self.keeper.chat_id)
        tokens, exchanges = stored_conversation(chat)
        assert tokens == s.tokens
        assert [(e.user, e.reply, e.start, e.reply_start, e.end) for e in exchanges] == \
            [(e.user, e.reply, e.start, e.reply_start, e.end) for e in s.exchanges]
        assert [(e.user, e.reply) for e in trimmed_exchanges(chat)] == [(e.user, e.reply) for e in s.trimmed]
        assert chat.system == s.system and chat.cache_seqlens == s.cache.seqlen
        assert chat.settings == {**s.settings.__dict__}

    def teardown(self):
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


TestChatMachine = ChatMachine.TestCase
TestChatMachine.settings = settings(max_examples=int(os.environ.get("HYPOTHESIS_EXAMPLES", "40")),
                                    stateful_step_count=20, deadline=None,
                                    suppress_health_check=[HealthCheck.too_slow])
