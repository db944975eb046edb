"""Session fixtures shared by the docs and browser tests."""

import os
import pathlib
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS_BUILD_TIMEOUT_S = 20 * 60  # a hung notebook cell must not hang CI


@pytest.fixture(scope="session")
def built_site(tmp_path_factory):
    """The site built once per session with `mkdocs build --strict`; its folder.

    Fails (with the build's output) if the strict build fails or runs past the timeout.
    """
    site_dir = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=DOCS_BUILD_TIMEOUT_S,
    )
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        pytest.fail(f"mkdocs build --strict failed after {elapsed:.0f} s:\n{result.stdout[-6000:]}\n{result.stderr[-12000:]}")
    print(f"\nmkdocs build --strict took {elapsed:.0f} s")
    return site_dir
