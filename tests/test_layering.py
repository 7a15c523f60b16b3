"""The house's shape, read off the real source: arrows go down only and no module cycles.

Every import counts, function-level ones included (a lazy import is still a dependency), except
those under `if TYPE_CHECKING:`, which never run.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("chatapp", "model", "kvcache", "assets")
LAYER = {"chatapp": 0, "model": 1, "kvcache": 2, "assets": 3}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def runtime_imports(tree: ast.AST):
    """Import nodes, skipping `if TYPE_CHECKING:` bodies."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in runtime_imports(ast.Module([child], [])))
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        yield from runtime_imports(node)


def graph() -> dict[str, set[str]]:
    mods = modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for node in runtime_imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                targets = [base, *(f"{base}.{a.name}" for a in node.names)]
            edges[name] |= {t for t in targets if t in mods and t != name}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
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
    assert "kvcache.cache" in edges["model.families.llama"] or "kvcache" in edges["model.families.llama"]
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]


def test_no_import_cycles_between_modules():
    assert cycles(graph()) == []


def test_arrows_go_down_only():
    up = [(a, b) for a, bs in graph().items() for b in bs
          if LAYER[b.split(".")[0]] < LAYER[a.split(".")[0]]]
    assert up == []


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
