"""The engine's imports run one way: no cycle between modules, none between subpackages.

The graph is read from the source with ast (nothing is imported), counting
imports inside functions too, so a cycle cannot hide behind a late import.
It is built as ``../shared/tools/structure.py`` builds it, so both agree.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[2] / "include"
PACKAGE = "crosscloud"


def engine_modules(root: Path = ENGINE, package: str = PACKAGE) -> dict[str, Path]:
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its file."""
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def module_graph(known: dict[str, Path]) -> dict[str, set[str]]:
    """Edges between modules; a package reaching its own modules (or they it) is not a cycle."""
    graph = {m: imported(m, p, known) for m, p in known.items()}
    return {m: {t for t in ts if not m.startswith(t + ".") and not t.startswith(m + ".")} for m, ts in graph.items()}


def subpackage_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The same edges between the engine's subpackages (``crosscloud.store``, ``crosscloud.pool``, ...)."""
    def owner(module: str) -> str:
        return ".".join(module.split(".")[:2])

    out: dict[str, set[str]] = {}
    for m, targets in graph.items():
        out.setdefault(owner(m), set()).update(owner(t) for t in targets if owner(t) != owner(m))
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while comp[-1:] != [v]:
                comp.append(stack.pop())
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _names(found: list[list[str]]) -> str:
    return "; ".join(" <-> ".join(c) for c in found)


def test_no_import_cycle_between_modules():
    found = cycles(module_graph(engine_modules()))
    assert not found, f"import cycles: {_names(found)}"


def test_no_import_cycle_between_subpackages():
    found = cycles(subpackage_graph(module_graph(engine_modules())))
    assert not found, f"import cycles between subpackages: {_names(found)}"


@pytest.mark.parametrize("late_import", [True, False])
def test_a_cycle_is_found_and_named_wherever_its_import_stands(tmp_path, late_import):
    """The check itself: two modules importing each other, one of them inside a function, is named."""
    pkg = tmp_path / "pkg"
    (pkg / "a").mkdir(parents=True)
    (pkg / "b").mkdir()
    for d in (pkg, pkg / "a", pkg / "b"):
        (d / "__init__.py").write_text("")
    (pkg / "a" / "one.py").write_text("from pkg.b.two import f\n")
    body = "def g():\n    from pkg.a.one import f\n" if late_import else "from pkg.a import one\n"
    (pkg / "b" / "two.py").write_text(body + "def f():\n    pass\n")
    graph = module_graph(engine_modules(tmp_path, "pkg"))
    assert cycles(graph) == [["pkg.a.one", "pkg.b.two"]]
    assert cycles(subpackage_graph(graph)) == [["pkg.a", "pkg.b"]]


def test_subpackages_alone_can_form_a_cycle(tmp_path):
    """Modules without a cycle among them can still tie their subpackages in a knot."""
    pkg = tmp_path / "pkg"
    for sub in ("a", "b"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "low.py").write_text("import pkg.b.high\n")
    (pkg / "b" / "high.py").write_text("")
    (pkg / "b" / "other.py").write_text("from pkg.a.mid import x\n")
    (pkg / "a" / "mid.py").write_text("x = 1\n")
    graph = module_graph(engine_modules(tmp_path, "pkg"))
    assert cycles(graph) == []
    assert cycles(subpackage_graph(graph)) == [["pkg.a", "pkg.b"]]
