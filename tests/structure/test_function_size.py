"""Short functions and a package root that only holds subpackages: the limits the project keeps.

Read with ast, nothing imported: every function in the engine, the Airflow
plugins and the DAGs stays within ``MAX_LINES``, and the package root keeps at
most ``MAX_FLAT`` modules of its own, so each concern has its subpackage.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 80
MAX_FLAT = 4
FOLDERS = ("include/crosscloud", "plugins", "dags")


def long_functions(paths: list[Path], limit: int = MAX_LINES) -> list[str]:
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_over_the_limit():
    paths = [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))]
    assert paths
    found = long_functions(paths)
    assert not found, f"functions over {MAX_LINES} lines: {found}"


def test_the_package_root_holds_subpackages_not_modules():
    flat = sorted(p.name for p in (ROOT / "include/crosscloud").glob("*.py") if p.name != "__init__.py")
    assert len(flat) <= MAX_FLAT, f"{len(flat)} modules directly in crosscloud/ (at most {MAX_FLAT}): {flat}"


def test_a_long_function_is_named(tmp_path):
    """The check itself: a function one line over the limit is reported with its place and length."""
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "m.py").write_text(f"def short():\n    pass\n\n\ndef too_long():\n{body}\n")
    assert long_functions([tmp_path / "m.py"]) == [f"{tmp_path / 'm.py'}:5 too_long ({MAX_LINES + 1} lines)"]
