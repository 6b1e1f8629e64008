"""Admission (bow_gateway/outbound/admission.py) is the one way into the index, whatever the
protocol: read from the source, as the structure it keeps (the behaviour is tested per protocol
in test_outbound_authentication.py, test_sse.py, test_flywheel.py and test_gobbler.py)."""

from __future__ import annotations

import ast
from pathlib import Path

from .support.import_graph import modules

ADMISSION = "bow_gateway.outbound.admission"
INDEX = "bow_gateway.core.index"


def indexing_calls(path: Path) -> list[int]:
    """Lines of ``path`` that add a connection to a criteria index, its only way in:
    ``.add(connection, key, criteria)`` on an index (``indices[...]``, ``index``, ``...index``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add"
            and len(node.args) == 3
        ):
            receiver = ast.unparse(node.func.value)
            if "indices" in receiver or receiver.lower().endswith("index"):
                found.append(node.lineno)
    return found


def test_admission_is_the_only_module_that_indexes_a_connection() -> None:
    others = {
        name: lines
        for name, path in modules().items()
        if name not in (ADMISSION, INDEX) and (lines := indexing_calls(path))
    }
    assert others == {}, f"connections indexed outside admit(): {others}"


def test_admission_indexes_a_connection_in_one_place() -> None:
    assert len(indexing_calls(modules()[ADMISSION])) == 1
