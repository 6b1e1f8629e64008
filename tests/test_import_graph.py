"""The import graph of the gateway's modules is one-way: no module imports, even lazily or only
for type checking, a module that imports it back; and it follows the layers (docs/layout.md): a
module imports only its own layer or a lower one (read from the source, nothing imported)."""

from __future__ import annotations

import ast
from pathlib import Path

from .support.import_graph import modules


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


# The layers, lowest first, as docs/layout.md describes them: each tier's layers may import their
# own layer and every lower tier's; layers that share a tier import nothing of each other (the ways
# in and out meet only through the backplane; the bundled plugins know neither).
LAYERS: tuple[dict[str, tuple[str, ...]], ...] = (
    {"core": ("bow_gateway.core",)},
    {"runtime": ("bow_gateway.runtime",)},
    {"backplanes": ("bow_gateway.backplanes",)},
    {"wire": ("bow_gateway.wire",)},
    # the connectors (section 20) are the webhook engine's destinations: its layer
    {
        "seams": ("bow_gateway.seams",),
        "webhooks": ("bow_gateway.webhooks", "bow_gateway.connectors"),
    },
    {
        "ingress": ("bow_gateway.ingress",),
        "outbound": ("bow_gateway.outbound",),
        "bundled plugins": (
            "bow_gateway.inbounds",
            "bow_gateway.outbounds",
            "bow_gateway.middlewares",
        ),
    },
    {"app": ("bow_gateway.app",)},
    {"public api": ("bow_gateway",), "job": ("bow_gateway.job",)},
    {"cli": ("bow_gateway.cli",)},
    {"entry points": ("bow_gateway.__main__", "bow_gateway.criteria_job")},
)
ROOT_PACKAGE = "bow_gateway"  # its __init__ only: a new top-level module is in no layer


def layer_of(name: str) -> tuple[int, str] | None:
    """The tier and the layer of module ``name`` (its longest listed package), or ``None``."""
    found: tuple[int, str, str] | None = None
    for tier, layers in enumerate(LAYERS):
        for layer, members in layers.items():
            for member in members:
                inside = name.startswith(member + ".") and member != ROOT_PACKAGE
                if (name == member or inside) and (found is None or len(member) > len(found[2])):
                    found = (tier, layer, member)
    return None if found is None else found[:2]


def against_the_layers(edges: dict[str, set[str]]) -> list[str]:
    """Every import of ``edges`` into a higher tier, or into another layer of the same tier."""
    wrong = []
    for name, targets in sorted(edges.items()):
        here = layer_of(name)
        for target in sorted(targets):
            there = layer_of(target)
            if here is None or there is None:
                continue  # test_every_module_is_in_a_layer names it
            if there[0] > here[0] or (there[0] == here[0] and there[1] != here[1]):
                wrong.append(f"{name} ({here[1]}) imports {target} ({there[1]})")
    return wrong


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


def test_every_module_is_in_a_layer() -> None:
    assert [name for name in sorted(modules()) if layer_of(name) is None] == []


def test_each_module_imports_only_its_own_layer_or_a_lower_one() -> None:
    wrong = against_the_layers(graph())
    assert wrong == [], "imports against the layers:\n" + "\n".join(wrong)


def test_the_outbounds_core_never_imports_its_protocols() -> None:
    protocols = "bow_gateway.outbound.protocols"
    wrong = [
        f"{name} imports {target}"
        for name, targets in sorted(graph().items())
        if name.startswith("bow_gateway.outbound.")
        and name != protocols  # the package: it imports its protocols, so that they register
        and not name.startswith(protocols + ".")
        for target in sorted(targets)
        if target.startswith(protocols + ".")
    ]
    assert wrong == []


def test_an_import_against_the_layers_is_found_and_named() -> None:
    edges = {
        "bow_gateway.core.message": {"bow_gateway.backplanes.base"},  # up
        "bow_gateway.ingress.control": {"bow_gateway.outbound.sockets"},  # across a tier
        "bow_gateway.outbound.sockets": {"bow_gateway.core.index", "bow_gateway.outbound.codec"},
        "bow_gateway.cli": {"bow_gateway", "bow_gateway.app.standalone"},
    }
    assert against_the_layers(edges) == [
        "bow_gateway.core.message (core) imports bow_gateway.backplanes.base (backplanes)",
        "bow_gateway.ingress.control (ingress) imports bow_gateway.outbound.sockets (outbound)",
    ]
    assert layer_of("bow_gateway.new_top_level_module") is None
    assert layer_of("bow_gateway") == (7, "public api")


def test_the_graph_sees_relative_absolute_and_lazy_imports() -> None:
    edges = graph()
    assert "bow_gateway.backplanes.base" in edges["bow_gateway.backplanes.redis"]  # relative
    assert "bow_gateway.backplanes.redis" in edges["bow_gateway.backplanes"]  # lazy, in a function
    assert "bow_gateway.core.criteria_snapshot" in edges["bow_gateway.middlewares.precomputed"]
    assert "bow_gateway.job.writer" in edges["bow_gateway.job.writing"]  # from . import writer


def test_a_cycle_is_found_and_named() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycle(edges) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
