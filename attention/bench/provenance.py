"""Where a result came from: `collect_provenance` records the device (`attention.machine`: the CPU flags that change
results), the PyTorch/CUDA/cuDNN versions, the git commit, the command line, and a sha256 of each `*.py` file of `attention`
but `attention/report/`, which only shows results. `dependencies` says which of those files a row's numbers depend
on (the modules that measured it and everything they import), so that a recorded row goes stale only when one of
them changes (`attention.bench.results.stale_rows`).
"""

import ast
import datetime
import hashlib
import os
import platform
import shlex
import sys
from pathlib import Path

import torch

from attention.machine import device_info, git_state, load_average

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # .../attention
REPO_DIR = PACKAGE_DIR.parent
SHOWING = "attention/report/"  # tables, charts and page text: never hashed, never a dependency
# Files that never change a measured number: the results file's schema and validator, this file, the presets, the
# command line, the file handling. Not followed: what they import counts only where a measuring file imports it.
BOOKKEEPING = ("attention/bench/results.py", "attention/bench/provenance.py", "attention/bench/profiles.py",
               "attention/bench/__main__.py", "attention/files.py")
# Catalogues of names (registries, a package's face): a module that imports one depends on the catalogue's own lines,
# not on every module it lists (a row depends on its own class, named by its sweep's `subjects`).
INDEXES = ("attention/__init__.py", "attention/registry.py", "attention/models/__init__.py", "attention/bench/__init__.py")


def source_files(package_dir=PACKAGE_DIR):
    """`{"attention/causal/flex.py": "<sha256 hex>", ...}`, sorted: each `*.py` file under `package_dir` but those under
    `attention/report/`, by its path relative to the repository root."""
    package_dir = Path(package_dir)
    root = package_dir.parent
    files = sorted(p for p in package_dir.rglob("*.py") if "__pycache__" not in p.parts)
    hashes = {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    return {path: digest for path, digest in hashes.items() if not path.startswith(SHOWING)}


def source_hash(package_dir=PACKAGE_DIR):
    """One sha256 (hex) over `source_files(package_dir)`: each sorted relative path and its file hash."""
    return files_hash(source_files(package_dir))


def files_hash(files):
    """One sha256 (hex) over `{path: sha256}`: each sorted path and its hash."""
    digest = hashlib.sha256()
    for path, file_hash in sorted(files.items()):
        digest.update(f"{path}\0{file_hash}\n".encode())
    return digest.hexdigest()


_IMPORTS = {}  # (root, path, sha256 of its bytes) -> the package's files it imports


def _module_file(name, root):
    """The file of the dotted module `name` under `root` (`x/y.py` or `x/y/__init__.py`), or None."""
    base = root / name.replace(".", "/")
    return next((found for found in (base.with_suffix(".py"), base / "__init__.py") if found.is_file()), None)


def imported_files(path, root):
    """The files of the `attention` package that the module at `root / path` imports (anywhere in it), as paths
    relative to `root`: `from attention.bench import core` names `attention/bench/core.py`, `from attention.models
    import MODELS` names `attention/models/__init__.py`."""
    source = (root / path).read_bytes()
    key = (root, path, hashlib.sha256(source).hexdigest())
    if key not in _IMPORTS:
        files = []
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                files += [_module_file(alias.name, root) for alias in node.names if alias.name.startswith("attention")]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("attention"):
                files += [_module_file(f"{node.module}.{alias.name}", root) or _module_file(node.module, root)
                          for alias in node.names]
        _IMPORTS[key] = {found.relative_to(root).as_posix() for found in files if found is not None}
    return _IMPORTS[key]


def dependencies(modules, package_dir=PACKAGE_DIR):
    """The files a measurement by `modules` (dotted names, e.g. a sweep's module and the class it measured) depends on:
    those modules and everything they import from the package, transitively, but not through `INDEXES` (their own
    lines count) or `BOOKKEEPING` files, and never `attention/report/`. Sorted relative paths."""
    root = Path(package_dir).parent
    todo, seen = [name.replace(".", "/") + ".py" for name in modules], set()
    while todo:
        path = todo.pop()
        if path in seen or path.startswith(SHOWING) or not (root / path).is_file():
            continue
        seen.add(path)
        if path not in INDEXES and path not in BOOKKEEPING:
            todo += imported_files(path, root)
    return sorted(seen - set(BOOKKEEPING))


def collect_provenance(device, argv=None):
    """Everything needed to say what produced a result on `device`, except the results themselves.

    `argv` is the command line, default `sys.argv` as `python -m attention.bench ...`. Returns a
    JSON-ready dict (docs/benchmark-schema.md, `provenance`).
    """
    argv = list(sys.argv if argv is None else argv)
    if argv and argv[0].endswith(os.path.join("attention", "bench", "__main__.py")):
        argv = ["python", "-m", "attention.bench", *argv[1:]]
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(argv), "argv": argv, "git": git_state(),
        "source_hash": source_hash(), "source_files": source_files(),
        "python": platform.python_version(), "platform": platform.platform(),
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "device": device_info(device), "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "load_average_start": load_average(),
    }
