"""The rooms' layering, read from the imports themselves: nothing under network/,
partition/ or consumer/ imports service/, and partition/ does not import network/ (buffer kinds and
flags live with the buffer). Imports under ``if TYPE_CHECKING:`` run nowhere and do not count."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "sparkflow_exchange"
FORBIDDEN = {"network": {"service"}, "partition": {"service", "network"}, "consumer": {"service"}}


def _runtime_imports(path: Path, typing_too: bool = False) -> list[tuple[int, str]]:
    """(line, module) of every import that runs (``typing_too``: and those for type checkers only), as an
    absolute name inside the package."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if not typing_too and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for child in node.body for n in ast.walk(child))
    package = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            base = list(package[:len(package) - node.level + 1]) if node.level else []
            out.append((node.lineno, ".".join(base + ([node.module] if node.module else []))))
        elif isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
    return out


@pytest.mark.parametrize("typing_too", [False, True], ids=["at run time", "for type checkers too"])
@pytest.mark.parametrize("room", sorted(FORBIDDEN))
def test_rooms_do_not_import_upwards(room, typing_too):
    """Not even for type hints: the network server names the service it serves through its own
    ``ConnectionHost`` protocol, which the service implements."""
    bad = []
    for path in sorted((PACKAGE / room).rglob("*.py")):
        for line, module in _runtime_imports(path, typing_too):
            parts = module.split(".")
            if parts[0] == "sparkflow_exchange" and len(parts) > 1 and parts[1] in FORBIDDEN[room]:
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}")
    assert not bad, "\n".join(bad)


def test_the_reader_sees_relative_imports():
    imports = dict((module, line) for line, module in _runtime_imports(PACKAGE / "partition" / "result_partition.py"))
    assert "sparkflow_exchange.buffer_kinds" in imports
