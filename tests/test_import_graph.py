"""The import graph of the gateway's modules is one-way: no module imports, even lazily or only
for type checking, a module that imports it back (read from the source, nothing imported)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {  # as setup.cfg installs them
    "bow_gateway": ROOT / "bow_gateway",
    "bow_gateway.inbounds": ROOT / "inbounds",
    "bow_gateway.outbounds": ROOT / "outbounds",
    "bow_gateway.middlewares": ROOT / "middlewares",
}


def modules() -> dict[str, Path]:
    """Every module of the installed packages, by dotted name (a package by its ``__init__``)."""
    found: dict[str, Path] = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = [*package.split("."), *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``name`` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                targets.add(submodule if submodule in known else base)
    return {target for target in targets if target in known and target != name}


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``edges`` (its modules, the first repeated at the end), or ``None``."""
    state: dict[str, str] = {}  # "open" while on the path, "done" once every edge is explored
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == "open":
                return [*path[path.index(target) :], target]
            if target not in state and (found := visit(target)) is not None:
                return found
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_no_module_imports_one_that_imports_it_back() -> None:
    found = cycle(graph())
    assert found is None, "import cycle: " + " -> ".join(found or [])


def test_the_graph_sees_relative_absolute_and_lazy_imports() -> None:
    edges = graph()
    assert "bow_gateway.backplanes.base" in edges["bow_gateway.backplanes.redis"]  # relative
    assert "bow_gateway.backplanes.redis" in edges["bow_gateway.backplanes"]  # lazy, in a function
    assert "bow_gateway.criteria_snapshot" in edges["bow_gateway.middlewares.precomputed"]
    assert "bow_gateway.job.writer" in edges["bow_gateway.job.writing"]  # from . import writer


def test_a_cycle_is_found_and_named() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycle(edges) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
