"""Marked copies stay identical to their originals: the one copy-drift check of the repository.

Each implementation file imports only torch, so small helpers and the canonical state-dict methods
are repeated, and every repeat is marked on the line above its `def`:
`# Same as attention/causal/split_heads.py::check_input` for a top-level function or class, or
`# Same as attention/causal/split_heads.py::SplitHeadsAttention.canonical_state_dict` for a
method. This test (like transformers' utils/check_copies.py) fails when a copy drifts from its
original, or when a marker names nothing or stands above nothing.

`python tests/test_copies.py --fix` rewrites every marked copy from its original (a changed helper is then one
edit and one command, as transformers' `check_copies.py --fix_and_overwrite`); without `--fix` it lists the
copies that drifted.
"""

import argparse
import ast
import pathlib
import re
import sys
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


def first_line(node):
    """The line a definition starts on: its first decorator's, or its `def`/`class` line."""
    return min([node.lineno] + [decorator.lineno for decorator in node.decorator_list])


def source(path, node):
    lines = path.read_text(encoding="utf-8").splitlines()
    return textwrap.dedent("\n".join(lines[first_line(node) - 1:node.end_lineno]))


def marked_copies(root=ROOT):
    """`(copy's path, marker's line, original's path, qualified name)` of every marker under `root`/attention."""
    copies = []
    for path in sorted((root / "attention").rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            match = MARKER.match(line)
            if match:
                copies.append((path.relative_to(root).as_posix(), number, match["path"], match["name"]))
    return copies


def fix(root=ROOT):
    """Rewrite every marked copy under `root` from its original, indented as the copy is; return the copies
    rewritten (`copy's path from original's path::name`). A copy of a copy follows its original's fix: the passes repeat until none changes.
    `ValueError` for a marker that names nothing or stands above nothing (the test says which)."""
    rewritten = []
    for _ in range(5):
        changed = False
        for copy_path in dict.fromkeys(copy[0] for copy in marked_copies(root)):
            path = root / copy_path
            lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
            nodes = {first_line(node): node for node in definitions(path).values()}
            markers = [(line, original, name) for where, line, original, name in marked_copies(root) if where == copy_path]
            for line, original_path, name in sorted(markers, reverse=True):  # bottom up: line numbers above stay
                originals = definitions(root / original_path)
                if name not in originals or line + 1 not in nodes:
                    raise ValueError(f"{copy_path}:{line}: the marker names {original_path}::{name}, which it cannot copy")
                indent = re.match(r"[ \t]*", lines[line - 1]).group()
                new = textwrap.indent(source(root / original_path, originals[name]), indent) + "\n"
                if "".join(lines[line:nodes[line + 1].end_lineno]) != new:
                    lines[line:nodes[line + 1].end_lineno] = [new]
                    rewritten.append(f"{copy_path} from {original_path}::{name}")
                    changed = True
            path.write_text("".join(lines), encoding="utf-8")
        if not changed:
            return rewritten
    raise ValueError("marked copies still change after 5 passes: a copy marked as its own original's original?")


COPIES = marked_copies()


def test_there_are_marked_copies():
    # Three argument checks in each of the ten files beside split_heads.py, at least.
    assert len(COPIES) >= 30, len(COPIES)


@pytest.mark.parametrize("copy_path,line,original_path,name", COPIES, ids=[f"{c[0]}:{c[3]}" for c in COPIES])
def test_marked_copy_is_identical(copy_path, line, original_path, name):
    originals = definitions(ROOT / original_path)
    assert name in originals, f"{copy_path}:{line} names {original_path}::{name}, which does not exist"
    copy_nodes = [node for node in definitions(ROOT / copy_path).values() if first_line(node) == line + 1]
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


def test_fix_rewrites_each_drifted_copy_from_its_original(tmp_path):
    """`--fix`: a drifted method and a drifted function (copied from a copy) take their originals' text, indented as
    the copy is; the code around them and a copy that did not drift stay as they are."""
    package = tmp_path / "attention"
    package.mkdir()
    (package / "a.py").write_text("class A:\n    @staticmethod\n    def f(x):\n        return x + 1\n\n\n"
                                  "def g(x):\n    return 2 * x\n")
    (package / "b.py").write_text("X = 1\n\n\nclass B:\n    # Same as attention/a.py::A.f\n    @staticmethod\n"
                                  "    def f(x):\n        return x - 1\n\n    def h(self):\n        return 0\n\n\n"
                                  "# Same as attention/a.py::g\ndef g(x):\n    return 2 * x\n")
    (package / "c.py").write_text("# Same as attention/b.py::B.f\n@staticmethod\ndef f(x):\n    return x * 7\n")
    assert fix(tmp_path) == ["attention/b.py from attention/a.py::A.f", "attention/c.py from attention/b.py::B.f"]
    assert (package / "b.py").read_text() == (
        "X = 1\n\n\nclass B:\n    # Same as attention/a.py::A.f\n    @staticmethod\n    def f(x):\n        return x + 1\n"
        "\n    def h(self):\n        return 0\n\n\n# Same as attention/a.py::g\ndef g(x):\n    return 2 * x\n")
    assert (package / "c.py").read_text() == "# Same as attention/b.py::B.f\n@staticmethod\ndef f(x):\n    return x + 1\n"
    assert fix(tmp_path) == []


def test_fix_refuses_a_marker_that_names_nothing(tmp_path):
    (tmp_path / "attention").mkdir()
    (tmp_path / "attention" / "a.py").write_text("# Same as attention/a.py::missing\ndef f():\n    return 1\n")
    with pytest.raises(ValueError, match="attention/a.py:1: the marker names attention/a.py::missing"):
        fix(tmp_path)


def identical(copy_path, line, original_path, name):
    """Whether the definition below the marker at `copy_path:line` is `original_path::name`, word for word."""
    originals = definitions(ROOT / original_path)
    return name in originals and any(
        first_line(node) == line + 1 and source(ROOT / copy_path, node) == source(ROOT / original_path, originals[name])
        for node in definitions(ROOT / copy_path).values())


def main(argv=None):
    parser = argparse.ArgumentParser(description="Check the marked copies; with --fix, rewrite each from its original.")
    parser.add_argument("--fix", action="store_true", help="rewrite every marked copy from its original")
    if parser.parse_args(argv).fix:
        for rewritten in fix():
            print(f"rewrote {rewritten}")
        return 0
    drifted = [f"{copy_path}:{line} (a copy of {original_path}::{name})"
               for copy_path, line, original_path, name in marked_copies() if not identical(copy_path, line, original_path, name)]
    for copy in drifted:
        print(f"drifted: {copy} (python tests/test_copies.py --fix rewrites it)")
    return 1 if drifted else 0


if __name__ == "__main__":
    sys.exit(main())
