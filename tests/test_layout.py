"""The size of the code (issue 28): no module of the gateway, its bundled plugins or its
benchmarks passes 400 lines, and no function passes 80: a module that grows past it is split by
what each part does (docs/layout.md), a function into named helpers. Read from the source with
``ast``, nothing imported."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("bow_gateway", "inbounds", "outbounds", "middlewares", "bench")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def sources() -> Iterator[Path]:
    for folder in FOLDERS:
        yield from sorted((ROOT / folder).rglob("*.py"))


def long_modules(paths: Iterator[Path], most: int = MAX_MODULE_LINES) -> list[str]:
    """Every module of ``paths`` over ``most`` lines, with its count."""
    found = []
    for path in paths:
        lines = len(path.read_text().splitlines())
        if lines > most:
            found.append(f"{path.relative_to(ROOT)}: {lines} lines")
    return found


def long_functions(source: str, where: str, most: int = MAX_FUNCTION_LINES) -> list[str]:
    """Every function (or method, nested ones too) of ``source`` over ``most`` lines, from its
    ``def`` to its last line."""
    found = []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > most:
                found.append(f"{where}:{node.lineno} {node.name}: {lines} lines")
    return found


def test_no_module_passes_400_lines() -> None:
    found = long_modules(sources())
    assert found == [], "split these modules by what each part does:\n" + "\n".join(found)


def test_no_function_passes_80_lines() -> None:
    found = [
        line
        for path in sources()
        for line in long_functions(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert found == [], "split these functions into named helpers:\n" + "\n".join(found)


def test_a_long_function_is_found_and_named() -> None:
    body = "".join(f"        x{index} = {index}\n" for index in range(80))
    source = f"def short():\n    pass\n\n\nclass A:\n    async def long(self):\n{body}"
    assert long_functions(source, "a.py") == ["a.py:6 long: 81 lines"]
    assert long_functions(source, "a.py", most=81) == []
