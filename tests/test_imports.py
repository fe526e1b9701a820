"""The import structure of the package, read from its source (ast; nothing is imported).

Every ``import`` counts, at any depth: under ``if TYPE_CHECKING:``, inside a function
(a lazy import), inside ``try``. An edge goes to the module a statement names
(``from pkg import mod`` to ``pkg.mod`` where that is a module, else to ``pkg``); the
implicit import of a parent package is no edge.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import weave_slurm

ROOT = Path(weave_slurm.__file__).parent
PACKAGE = "weave_slurm"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _targets(node: ast.AST, here: str, is_package: bool, known: set[str]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parts = here.split(".")
            anchor = parts if is_package else parts[:-1]
            anchor = anchor[:len(anchor) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            yield sub if sub in known else base


def import_graph() -> dict[str, set[str]]:
    """Each module of the package -> the modules of the package it imports."""
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        graph[name] = {t for node in ast.walk(tree)
                       for t in _targets(node, name, is_package, known)
                       if t in known and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_graph_sees_type_checking_and_lazy_imports() -> None:
    graph = import_graph()
    # under TYPE_CHECKING only, and inside a function only
    assert "weave_slurm.node.resident" in graph["weave_slurm.hosted.phases"]
    assert "weave_slurm.device.switch" in graph["weave_slurm.workloads.grpo_toy"]


def test_the_package_has_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


def test_a_cycle_is_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_device_switch_imports_no_package_that_uses_it() -> None:
    """docs/architecture.md: ``node/``, ``hosted/`` and ``workloads/`` import
    ``device/``; ``device/`` imports none of them (nor anything above them)."""
    graph = import_graph()
    allowed = {f"{PACKAGE}.device", f"{PACKAGE}.errors", f"{PACKAGE}.vocab"}
    outside = {(m, t) for m, targets in graph.items() if _in(m, f"{PACKAGE}.device")
               for t in targets if not any(_in(t, a) for a in allowed)}
    assert outside == set()
