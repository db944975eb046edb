"""Marked copies stay identical to their originals: the one copy-drift check of the repository.

Each implementation file imports only torch, so small helpers and the canonical state-dict methods
are repeated, and every repeat is marked on the line above its `def`:
`# Same as attention/causal/split_heads.py::check_input` for a top-level function or class, or
`# Same as attention/causal/split_heads.py::SplitHeadsAttention.canonical_state_dict` for a
method. This test (like transformers' utils/check_copies.py) fails when a copy drifts from its
original, or when a marker names nothing or stands above nothing.
"""

import ast
import pathlib
import re
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^[ \t]*# Same as (?P<path>[\w/.]+\.py)::(?P<name>[\w.]+)\s*$")


def definitions(path):
    """Every function and class of a file, top-level and nested in classes: {qualified name: node}."""
    found = {}

    def walk(body, prefix):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found[prefix + node.name] = node
                if isinstance(node, ast.ClassDef):
                    walk(node.body, prefix + node.name + ".")

    walk(ast.parse(path.read_text(encoding="utf-8")).body, "")
    return found


def source(path, node):
    lines = path.read_text(encoding="utf-8").splitlines()
    first = min([node.lineno] + [decorator.lineno for decorator in node.decorator_list])
    return textwrap.dedent("\n".join(lines[first - 1:node.end_lineno]))


def marked_copies():
    copies = []
    for path in sorted((ROOT / "attention").rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            match = MARKER.match(line)
            if match:
                copies.append((path.relative_to(ROOT).as_posix(), number, match["path"], match["name"]))
    return copies


COPIES = marked_copies()


def test_there_are_marked_copies():
    # Three argument checks in each of the ten files beside split_heads.py, at least.
    assert len(COPIES) >= 30, len(COPIES)


@pytest.mark.parametrize("copy_path,line,original_path,name", COPIES, ids=[f"{c[0]}:{c[3]}" for c in COPIES])
def test_marked_copy_is_identical(copy_path, line, original_path, name):
    originals = definitions(ROOT / original_path)
    assert name in originals, f"{copy_path}:{line} names {original_path}::{name}, which does not exist"
    copy_nodes = [node for node in definitions(ROOT / copy_path).values()
                  if min([node.lineno] + [d.lineno for d in node.decorator_list]) == line + 1]
    assert copy_nodes, f"{copy_path}:{line}: no definition right after its marker"
    copy_node = copy_nodes[0]
    assert copy_node.name == name.rsplit(".", 1)[-1], f"{copy_path}:{line}: the marker names {name}, the copy is {copy_node.name}"
    assert source(ROOT / copy_path, copy_node) == source(ROOT / original_path, originals[name]), (
        f"{copy_path}::{name} drifted from {original_path}::{name}")


def test_a_drifted_copy_is_caught(tmp_path):
    original = tmp_path / "a.py"
    original.write_text("class A:\n    def f(self):\n        return 1\n")
    copy = tmp_path / "b.py"
    copy.write_text("class B:\n    # Same as a.py::A.f\n    def f(self):\n        return 2\n")
    node = definitions(copy)["B.f"]
    assert source(copy, node) != source(original, definitions(original)["A.f"])
    assert MARKER.match(copy.read_text().splitlines()[1])["name"] == "A.f"
