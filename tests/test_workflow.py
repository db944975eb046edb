"""The deploy workflow (.github/workflows/docs.yml): linted, and building with the README's command.

It cannot run here (no GitHub); these checks are what can be done offline: GitHub's workflow schema
(check-jsonschema's vendored copy), zizmor's audits without network, and the build step running the
README's docs build command after the README's install.
"""

import pathlib
import re
import shutil
import sys
import subprocess

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "docs.yml"


def readme_block(marker):
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(rf"<!-- {marker} -->\n```bash\n(.*?)\n```", text, re.DOTALL)
    assert match, f"README.md has no <!-- {marker} --> block"
    return match.group(1).strip()


def steps(job):
    return yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))["jobs"][job]["steps"]


def linter(name):
    """The linter's executable: on PATH, or beside this Python (a virtual environment used without activating it)."""
    path = shutil.which(name) or shutil.which(name, path=str(pathlib.Path(sys.executable).parent))
    if path is None:
        pytest.fail(f"{name} is not installed: it is in the test extra (pip install -e '.[test]')")
    return path


def test_workflow_matches_githubs_schema():
    run = subprocess.run([linter("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", str(WORKFLOW)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stdout + run.stderr


def test_workflow_passes_zizmor_offline():
    run = subprocess.run([linter("zizmor"), "--offline", "--config", str(ROOT / ".github" / "zizmor.yml"), str(WORKFLOW)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stdout + run.stderr


def test_workflow_builds_with_the_readmes_commands():
    build = steps("build")
    runs = [step.get("run", "") for step in build]
    assert readme_block("docs build command") in runs, runs
    install = next(run for run in runs if "pip install" in run)
    assert 'torch==2.13.0 -e ".[docs]"' in install and "download.pytorch.org/whl/cpu" in install, install
    assert any(step.get("uses", "").startswith("actions/upload-pages-artifact") for step in build)
    assert any(step.get("uses", "").startswith("actions/deploy-pages") for step in steps("deploy"))


def test_workflow_publishes_on_pushes_to_main():
    # PyYAML reads the key `on` as True.
    triggers = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))[True]
    assert triggers["push"]["branches"] == ["main"]
