"""The chats screen, driven by Textual's pilot in a minimal host app over a real SQLite store,
through a real keeper: a --backend one, which needs no model (nothing here reaches its server)."""

import asyncio

from textual.app import App

from chatapp.chat.settings import Settings
from chatapp.remote.client import OpenAIClient
from chatapp.remote.keeper import RemoteKeeper
from chatapp.remote.session import RemoteSession
from chatapp.store.database import ChatStore
from chatapp.store.records import ChatRecord, StoredMessage
from chatapp.tui.chats_screen import ChatAction, ChatsScreen


def keeper_on(store: ChatStore, current: int | None = None) -> RemoteKeeper:
    keeper = RemoteKeeper(RemoteSession(OpenAIClient("http://127.0.0.1:9"), "x", Settings()), store)
    keeper.chat_id = current
    return keeper


class Host(App[None]):
    """Stands in for the chat app: shows the screen and keeps what it dismisses with."""

    def __init__(self, store: ChatStore, current=None):
        super().__init__()
        self.keeper = keeper_on(store, current)
        self.results: list = []

    def on_mount(self) -> None:
        self.push_screen(ChatsScreen(self.keeper), self.results.append)


def fill(store: ChatStore, n: int) -> list[int]:
    ids = []
    for i in range(n):
        msgs = [StoredMessage("user", f"question {i}", [1]), StoredMessage("assistant", "answer", [2])]
        ids.append(store.save(ChatRecord(f"chat {i}", "random:tiny", "fp", "tfp", {}, "sys", [], 0, msgs)))
    return ids


def run(store, current=None, keys=()):
    async def go():
        app = Host(store, current)
        async with app.run_test() as pilot:
            await pilot.pause()
            screen = app.screen
            for k in keys:
                await pilot.press(*k) if isinstance(k, tuple) else await pilot.press(k)
                await app.workers.wait_for_complete()  # a rename or delete runs in a worker thread
                await pilot.pause()
            rows = [screen.table.get_row_at(i) for i in range(screen.table.row_count)] if app.screen is screen else None
            return app.results, rows
    return asyncio.run(go())


def test_lists_newest_first_and_opens_the_selected_chat(tmp_path):
    store = ChatStore(tmp_path)
    a, b, c = fill(store, 3)
    results, _ = run(store, keys=["down", "enter"])
    assert results == [ChatAction("open", b)]  # c is newest and first; down moves to b
    _, rows = run(store, current=c)
    assert [r[0] for r in rows] == [str(c), str(b), str(a)] and str(rows[0][1]) == "chat 2 (open)"
    assert rows[0][3] == "1"  # one message (with its reply), as /edit numbers them


def test_new_and_escape(tmp_path):
    store = ChatStore(tmp_path)
    fill(store, 1)
    assert run(store, keys=["n"])[0] == [ChatAction("new")]
    assert run(store, keys=["escape"])[0] == [None]


def test_rename_saves_to_the_store_and_escape_cancels(tmp_path):
    store = ChatStore(tmp_path)
    (chat_id,) = fill(store, 1)
    keys = ["r", "ctrl+a", "ctrl+k", *"drafts and notes", "enter"]  # typed letters (n, r, d) stay in the box
    results, rows = run(store, keys=keys)
    assert results == [] and store.get(chat_id).title == "drafts and notes" and str(rows[0][1]) == "drafts and notes"
    run(store, keys=["r", "x", "escape"])
    assert store.get(chat_id).title == "drafts and notes"


def test_delete_needs_two_presses_and_spares_the_open_chat(tmp_path):
    store = ChatStore(tmp_path)
    a, b = fill(store, 2)
    store.snapshot_dir(a).mkdir(parents=True)
    _, rows = run(store, current=b, keys=["d"])  # b is first: open, so refused
    assert len(rows) == 2 and store.get(b) is not None
    _, rows = run(store, current=b, keys=["down", "d"])  # armed only
    assert len(rows) == 2
    _, rows = run(store, current=b, keys=["down", "d", "d"])
    assert [r[0] for r in rows] == [str(b)] and store.get(a) is None and not store.snapshot_dir(a).exists()


def test_titles_and_model_names_are_shown_as_typed_not_as_markup(tmp_path):
    """A first message like "[INST] hi [/INST]" becomes the title; as markup it crashed the screen."""
    store = ChatStore(tmp_path)
    msgs = [StoredMessage("user", "q", [1]), StoredMessage("assistant", "a", [2])]
    store.save(ChatRecord("[INST] hi [/INST] [bold]x[/]", "m[/b]odel", "fp", "tfp", {}, "sys", [], 0, msgs))
    results, rows = run(store)
    assert results == [] and str(rows[0][1]) == "[INST] hi [/INST] [bold]x[/]" and str(rows[0][2]) == "m[/b]odel"


def test_empty_store_says_so(tmp_path):
    async def go():
        app = Host(ChatStore(tmp_path))
        async with app.run_test() as pilot:
            await pilot.pause()
            hint = str(app.screen.query_one("#chats-hint").render())
            await pilot.press("enter")  # nothing to open: nothing happens
            await pilot.pause()
            return hint, app.results
    hint, results = asyncio.run(go())
    assert "No stored chats yet" in hint and results == []


def test_search_filters_by_title_and_message_and_esc_clears_it(tmp_path):
    store = ChatStore(tmp_path)
    fill(store, 3)
    store.save(ChatRecord("recipes", "random:tiny", "fp", "tfp", {}, "sys", [], 0,
                        [StoredMessage("user", "how long to bake banana_bread?", [1]),
                         StoredMessage("assistant", "about an hour", [2])]))
    _, rows = run(store, keys=["slash", tuple("banana_b")])  # '_' is literal, not LIKE's wildcard
    assert [r[1].plain for r in rows] == ["recipes"]
    _, rows = run(store, keys=["slash", tuple("CHAT 1")])  # titles too, any case
    assert [r[1].plain for r in rows] == ["chat 1"]
    results, rows = run(store, keys=["slash", tuple("nothing like it"), "escape"])
    assert len(rows) == 4 and results == []  # Esc cleared the search, the screen stays
    results, _ = run(store, keys=["slash", tuple("hour"), "enter", "enter"])  # Enter: to the list, then open
    assert results == [ChatAction("open", 4)]


def test_the_list_counts_exchanges_as_edit_numbers_them_and_says_so(tmp_path):
    """The column said "messages" over a count of exchanges (issue 44)."""
    store = ChatStore(tmp_path)
    fill(store, 1)  # one user message and its reply: message 1, as /edit 1 and the transcript say

    async def go():
        app = Host(store)
        async with app.run_test() as pilot:
            await pilot.pause()
            table = app.screen.table
            return [str(c.label) for c in table.columns.values()], table.get_row_at(0)[3]
    assert asyncio.run(go()) == (["id", "title", "model", "exchanges", "updated"], "1")


def test_renaming_the_open_chat_goes_through_the_keeper(tmp_path):
    """The screen writes only through the keeper (in a worker thread): the open chat's title
    follows at once, and the keeper's own refusal of deleting it holds even past the screen."""
    store = ChatStore(tmp_path)
    (chat_id,) = fill(store, 1)

    async def go():
        app = Host(store, current=chat_id)
        async with app.run_test() as pilot:
            await pilot.pause()
            await pilot.press("r", "ctrl+a", "ctrl+k", *"kept", "enter")
            await app.workers.wait_for_complete()
            await pilot.pause()
            return app.keeper.title, str(app.screen.table.get_row_at(0)[1])
    assert asyncio.run(go()) == ("kept", "kept (open)") and store.get(chat_id).title == "kept"
