"""Crash safety in CI: a sample of tests/crash_campaign.py, one `kill -9` of the real headless app
after each kind of event and at a random moment inside a turn and a snapshot write, and one trial
of each injected failure (a held lock, a full disk, an open failing after the adopt step, an exit
with a turn unsaved: tests/crash_faults.py). The full
campaign, whose figures docs/persistence.md gives: `python tests/crash_campaign.py --trials 110`.
CRASH_TRIALS / CRASH_SEED make this one longer: `CRASH_TRIALS=44 pytest tests/test_crash.py`.
"""

import os

from helpers import assert_invariant

from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from chatapp.keeper.keeper import ChatKeeper
from chatapp.store.database import ChatStore
from tests.crash_campaign import KINDS, campaign, report
from tests.crash_ledger import read_disk

TRIALS = int(os.environ.get("CRASH_TRIALS", str(len(KINDS))))
SEED = int(os.environ.get("CRASH_SEED", "7"))


def test_kill_9_after_every_kind_of_event_loses_nothing_reported(tmp_path, tiny):
    fig = campaign(tmp_path, TRIALS, SEED)
    assert not fig.failures, report(fig, SEED)
    assert fig.trials == TRIALS and set(fig.kills) == set(KINDS[:TRIALS])
    # whatever the kills left on disk opens into a correct cache
    disk = read_disk(tmp_path)
    if disk.latest is not None:
        k = ChatKeeper(Session(tiny, Settings(), context=256), ChatStore(tmp_path))
        k.open(disk.latest)
        assert_invariant(k.session)
        in_context = [(u, r) for u, r, kept in disk.chats[disk.latest].pairs if kept]
        assert [(ex.user, ex.reply) for ex in k.session.exchanges] == in_context
