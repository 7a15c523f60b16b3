"""The house's shape, read off the real source: arrows go down only, no module cycles and no
cycles between folders.

Every import counts: function-level ones (a lazy import is still a dependency) and those under
`if TYPE_CHECKING:` (a type a module names is a dependency of its design, and a cycle hidden
there is still a cycle).
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("chatapp", "model", "kvcache", "assets")

# The rooms, top to bottom: an import goes from a room to one below it, never up or sideways
# out of order. A room is a folder (a package and everything in it) or a module at a package's
# top level (chatapp/cli.py, model/errors.py); the package itself is its `__init__.py`.
ROOMS = [
    "chatapp.cli", "chatapp.bench", "chatapp.serve", "chatapp.tui", "chatapp.headless", "chatapp.remote",
    "chatapp.launch", "chatapp.keeper", "chatapp.store", "chatapp.pull", "chatapp.config", "chatapp.options",
    "chatapp.chat", "chatapp",
    "model.loading", "model.decode", "model.families", "model.chat_formats", "model.tokenizers", "model.cpu",
    "model.files", "model.limits", "model.paths", "model.errors", "model.escapes", "model",
    "kvcache", "assets",
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


WHOLE = ("kvcache", "assets")  # packages that are one room each, however many files they hold


def room(name: str, path: Path) -> str:
    """The folder a module lives in, or the module itself at a package's top level."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[0] in WHOLE:
        return parts[0]
    if path.name == "__init__.py":
        return ".".join(parts[:-1][:2])
    return ".".join(parts[:2]) if len(parts) > 2 else name


def imports(tree: ast.AST):
    """Every import node, at any depth (functions and `if TYPE_CHECKING:` bodies included)."""
    return (n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)))


def graph() -> dict[str, set[str]]:
    mods = modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for node in imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                targets = [base, *(f"{base}.{a.name}" for a in node.names)]
            edges[name] |= {t for t in targets if t in mods and t != name}
    return edges


def room_graph() -> dict[str, set[str]]:
    mods = modules()
    rooms = {m: room(m, p) for m, p in mods.items()}
    edges: dict[str, set[str]] = {r: set() for r in rooms.values()}
    for a, bs in graph().items():
        edges[rooms[a]] |= {rooms[b] for b in bs if rooms[b] != rooms[a]}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_real_imports():
    edges = graph()
    assert "chatapp.chat.session" in edges["chatapp.keeper.keeper"]
    assert "model.families.layers" in edges["model.families.llama"]
    assert "kvcache" in edges["model.families.llama"]
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]


def test_imports_under_type_checking_count():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from model.families import llama\n")
    assert [n.module for n in imports(tree) if isinstance(n, ast.ImportFrom)] == ["typing", "model.families"]


def test_rooms_are_folders_and_top_level_modules():
    mods = modules()
    assert room("model.decode.graphs", mods["model.decode.graphs"]) == "model.decode"
    assert room("model.decode", mods["model.decode"]) == "model.decode"
    assert room("model.errors", mods["model.errors"]) == "model.errors"
    assert room("model", mods["model"]) == "model"
    assert room("chatapp.tui.app", mods["chatapp.tui.app"]) == "chatapp.tui"
    assert room("kvcache.cache", mods["kvcache.cache"]) == "kvcache"


def test_no_import_cycles_between_modules():
    assert cycles(graph()) == []


def test_no_import_cycles_between_folders():
    assert cycles(room_graph()) == []


def test_every_room_has_its_place():
    assert set(room_graph()) - set(ROOMS) == set(), "add the new folder to ROOMS, where it belongs"


def test_arrows_go_down_only():
    rank = {r: i for i, r in enumerate(ROOMS)}
    up = {(a, b) for a, bs in room_graph().items() for b in bs if a in rank and b in rank and rank[b] < rank[a]}
    assert up == set()


def test_the_kernels_import_no_family():
    """Steps take the model they serve; only the step table (decode/steps.py) and what asks it
    which family a model is read the registry, and nothing in decode/ or cpu/ imports a family's file."""
    edges = graph()
    found = {(a, b) for a, bs in edges.items() if a.startswith(("model.decode", "model.cpu"))
             for b in bs if b.startswith("model.families") and b != "model.families.registry"}
    assert found == set()


def test_the_entry_point_and_the_bench_stay_out_of_the_app():
    edges = graph()
    assert [a for a, bs in edges.items() if "chatapp.cli" in bs] == []
    users = {a for a, bs in edges.items() if any(b.startswith("chatapp.bench") for b in bs)}
    assert {u for u in users if not u.startswith("chatapp.bench")} == {"chatapp.cli"}


def every_import(path: Path) -> set[str]:
    """Every module a file names in an import, `if TYPE_CHECKING:` ones included."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return out


def test_the_store_is_persistence_and_the_keeper_owns_its_state():
    """Issue 25: chatapp/store/ knows nothing of the controller or the faces; nothing in
    chatapp/keeper/ imports the keeper back (the branch/switch/rollback cycle that hid behind
    TYPE_CHECKING), and the keeper knows no face."""
    mods = modules()
    faces = ("chatapp.tui", "chatapp.headless", "chatapp.launch", "chatapp.remote", "chatapp.cli")
    for name, path in mods.items():
        names = every_import(path)
        if name.startswith("chatapp.store"):
            assert not {n for n in names if n.startswith(("chatapp.keeper", *faces))}, name
        if name.startswith("chatapp.keeper"):
            assert not {n for n in names if n.startswith(faces)}, name
            if name != "chatapp.keeper.keeper":
                assert not {n for n in names if n.startswith("chatapp.keeper.keeper")}, name


def imports_between_tests() -> list[tuple[str, str]]:
    """(importing tests/ file, module it imports) for every tests/ module another one imports."""
    names = {p.stem for p in (ROOT / "tests").glob("*.py")}
    out = []
    for path in (ROOT / "tests").glob("*.py"):
        for node in imports(ast.parse(path.read_text())):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            out += [(path.stem, m) for m in mods if m.removeprefix("tests.") in names]
    return out


def test_test_modules_are_imported_under_one_name():
    """`from tests.helpers import` beside `from helpers import` loads the module twice (pytest
    imports test files by their bare name): each tests/ module goes by one name."""
    spellings: dict[str, set[str]] = {}
    for _, m in imports_between_tests():
        spellings.setdefault(m.removeprefix("tests."), set()).add(m)
    assert {k: v for k, v in spellings.items() if len(v) > 1} == {}
    assert spellings["helpers"] == {"helpers"}  # the check sees the imports it is about


def test_no_test_module_imports_another():
    """What two test modules share lives in tests/helpers.py (fixtures in conftest.py), so a test
    module is never imported for its helpers: no test_*.py module imports another."""
    found = {(a, m) for a, m in imports_between_tests() if m.removeprefix("tests.").startswith("test_")}
    assert found == set()
    assert len({a for a, m in imports_between_tests() if m == "helpers"}) > 20  # the check sees the helpers' users


def test_no_python_file_in_chatapp_or_model_over_300_lines():
    """One idea a file: past 300 lines a module holds two (the C step's sources are exempt)."""
    long = {str(p.relative_to(ROOT)): n for pkg in ("chatapp", "model") for p in (ROOT / pkg).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 300}
    assert long == {}


# Who may import a family's own file (model/families/<family>.py) by name: the registry, and the
# few readers of a format only that family has. Everything else reaches a family through its
# registry entry, so a new family is its file plus its entry (docs/families.md).
FAMILY_FILE_READERS = {
    "model.loading.nanochat": "nanochat's checkpoint format (model_*.pt, meta_*.json) is nanochat's alone",
    "model.loading.nanochat_detect": "the same: which nanochat generation a checkpoint is",
    "chatapp.bench.peer": "the bench's transformers twin of a model, built from the module's own fields",
}


def test_a_family_is_its_file_and_its_registry_entry():
    families = {m for m in modules() if m.startswith("model.families.")
                and m.rsplit(".", 1)[1] not in ("registry", "declare", "layers")}
    assert {"model.families.gemma", "model.families.llama", "model.families.nanochat"} <= families
    readers = {a for a, bs in graph().items() if bs & families and not a.startswith("model.families")}
    assert readers == set(FAMILY_FILE_READERS)
