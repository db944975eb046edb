"""Marked copies stay identical to their originals.

Each implementation file imports only torch, so small helpers are repeated, and every repeat is
marked `# Same as attention/causal/split_heads.py::check_input` on the line above its `def`. This
test (like transformers' utils/check_copies.py) fails when a copy drifts from its original.
"""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^# Same as (?P<path>[\w/.]+\.py)::(?P<name>\w+)\s*$")


def function_sources(path):
    """Top-level function and class sources of a file, by name."""
    text = path.read_text()
    lines = text.splitlines()
    return {node.name: "\n".join(lines[node.lineno - 1:node.end_lineno])
            for node in ast.parse(text).body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}


def marked_copies():
    copies = []
    for path in sorted((ROOT / "attention").rglob("*.py")):
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines):
            match = MARKER.match(line)
            if match:
                copies.append((path.relative_to(ROOT).as_posix(), number + 1, match["path"], match["name"]))
    return copies


COPIES = marked_copies()


def test_there_are_marked_copies():
    assert len(COPIES) >= 24  # three helpers in each of the eight files beside split_heads.py, at least


@pytest.mark.parametrize("copy_path,line,original_path,name", COPIES, ids=[f"{c[0]}:{c[3]}" for c in COPIES])
def test_marked_copy_is_identical(copy_path, line, original_path, name):
    original = function_sources(ROOT / original_path)
    assert name in original, f"{copy_path}:{line} names {original_path}::{name}, which does not exist"
    lines = (ROOT / copy_path).read_text().splitlines()
    following = "\n".join(lines[line:])  # the text after the marker line
    copy = function_sources_from_text(following).get(name)
    assert copy is not None, f"{copy_path}:{line}: no `{name}` right after its marker"
    assert copy == original[name], f"{copy_path}::{name} drifted from {original_path}::{name}"


def function_sources_from_text(text):
    """The first top-level definition in `text`, by name."""
    lines = text.splitlines()
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            return {node.name: "\n".join(lines[node.lineno - 1:node.end_lineno])}
    return {}
