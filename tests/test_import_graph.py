"""No import circle inside corral: every ``import`` of every module under ``src/corral`` counts -- at module
level, under ``if TYPE_CHECKING:`` and inside functions alike -- because a back edge that Python never runs
still ties the two modules into one. A class that outgrew its file is split into parts that hold one another
(or a lower module both import), never into pieces that reach back to their host.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def modules(src: Path, package: str) -> dict[str, tuple[Path, bool]]:
    """Every module of ``package`` under ``src``: dotted name -> (path, whether it is a package's ``__init__``)."""
    out: dict[str, tuple[Path, bool]] = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        out[".".join(parts)] = (path, is_package)
    return out


def _known(name: str, known: dict[str, tuple[Path, bool]]) -> str | None:
    """The module of ``known`` that importing ``name`` loads last (``a.b.c`` -> ``a.b`` if ``c`` is a name)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imported(module: str, known: dict[str, tuple[Path, bool]]) -> Iterator[str]:
    """The modules of ``known`` that ``module`` imports, wherever the import statement is."""
    path, is_package = known[module]
    here = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _known(alias.name, known)
                if target is not None:
                    yield target
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = here.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                target = sub if sub in known else _known(base, known)
                if target is not None:
                    yield target


def graph(src: Path, package: str) -> dict[str, set[str]]:
    known = modules(src, package)
    return {m: {t for t in imported(m, known) if t != m} for m in known}


def circles(edges: dict[str, set[str]]) -> list[tuple[list[str], list[str]]]:
    """Each strongly connected component of more than one module: its modules, and one path that closes it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted((sorted(c), _closing_path(c, edges)) for c in components)


def _closing_path(component: set[str], edges: dict[str, set[str]]) -> list[str]:
    """A shortest path inside ``component`` from its first module back to it."""
    start = min(component)
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(edges[v] & component):
            if w == start:
                return [*paths[v], start]
            if w not in paths:
                paths[w] = [*paths[v], w]
                todo.append(w)
    raise AssertionError(f"no circle in {sorted(component)}")  # (a component of 2+ always has one)


def test_corral_has_no_import_circle() -> None:
    found = circles(graph(SRC, "corral"))
    assert found == [], "import circles (TYPE_CHECKING and function-level imports count):\n" + "\n".join(
        f"{' <-> '.join(members)}, e.g. {' -> '.join(path)}" for members, path in found
    )


def test_the_reading_sees_type_checking_and_function_level_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "host.py").write_text("from pkg.sub import part\n")
    (pkg / "sub" / "part.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..host import Host\n"
    )
    (pkg / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "b.py").write_text("import pkg.a.name\n")
    (pkg / "c.py").write_text("from pkg import a, host\n")
    edges = graph(tmp_path, "pkg")
    assert edges["pkg.c"] == {"pkg.a", "pkg.host"}
    assert circles(edges) == [
        (["pkg.a", "pkg.b"], ["pkg.a", "pkg.b", "pkg.a"]),
        (["pkg.host", "pkg.sub.part"], ["pkg.host", "pkg.sub.part", "pkg.host"]),
    ]
