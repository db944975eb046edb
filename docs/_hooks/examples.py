"""MkDocs hook: publish the top-level `examples/*.py` scripts as executed pages.

* `on_files` adds each `examples/<name>.py` as a File with src_uri `examples/<name>.py`, read in
  place from the top-level folder (no copy under docs/), so nav entries can name it and
  mkdocs-jupyter turns it into a page. Next to each page it generates `<name>.ipynb` (the same
  cells, unexecuted, via jupytext) so a reader can download the notebook as well as the script.
* `on_config` decides mkdocs-jupyter's cache. Its cache key covers the notebook text only, not the
  `attention/` package the examples import, so `mkdocs build` always runs with the cache off (CI
  never reuses stale outputs). Under `mkdocs serve` the cache is on, in a folder named after a
  hash of `attention/**/*.py` and the torch version: editing a Markdown page rebuilds without
  re-running the examples, editing an example re-runs that example, and editing the package
  re-runs all of them.
* `on_config` also points the kernels that execute the examples at a fresh IPython profile
  (`IPYTHONDIR`) whose only setting keeps the kernel's log to errors: a reader's own startup files
  cannot change what a page shows, and the console does not repeat, for every page, ipykernel 7's
  warning that its local TCP connection is unencrypted (nothing a reader can act on).
* `ATTENTION_DOCS_EXECUTE=kv_cache,gqa` (a preview while writing pages): only those examples run; the others show
  their code unexecuted (mkdocs-jupyter's `execute_ignore`). Never set in CI or the deploy workflow.
* `on_page_content` removes the MathJax and Mermaid loaders that nbconvert's template adds to every
  notebook page: both would fetch scripts from a CDN, and the examples use neither.
"""

import hashlib
import importlib.util
import importlib.metadata
import json
import logging
import os
import pathlib
import re
import shutil
import tempfile

import jupytext
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

log = logging.getLogger("mkdocs.hooks.examples")

EXAMPLES_DIR = "examples"
JUPYTER_PLUGIN = "mkdocs-jupyter"

# Kept across rebuilds: MkDocs loads a hook module once per process, and calls on_startup only once.
command_seen = {"command": "build"}
kernel_profile = {}  # "ipython_dir": the folder made by quiet_kernel_profile, once per process


def on_startup(command, dirty):
    command_seen["command"] = command


def project_root(config):
    return pathlib.Path(config.config_file_path).resolve().parent


def package_hash(root):
    """SHA-256 over the installed torch version and the paths and bytes of every `attention/**/*.py`."""
    hasher = hashlib.sha256()
    hasher.update(importlib.metadata.version("torch").encode())
    for path in sorted((root / "attention").rglob("*.py")):
        hasher.update(str(path.relative_to(root)).encode())
        hasher.update(path.read_bytes())
    return hasher.hexdigest()[:16]


def quiet_kernel_profile():
    """`IPYTHONDIR` for the example kernels: a new folder whose default profile logs errors only."""
    if "ipython_dir" not in kernel_profile:
        ipython_dir = pathlib.Path(tempfile.mkdtemp(prefix="attention-docs-ipython-"))
        (ipython_dir / "profile_default").mkdir()
        (ipython_dir / "profile_default" / "ipython_kernel_config.json").write_text(
            json.dumps({"IPKernelApp": {"log_level": "ERROR"}}))
        kernel_profile["ipython_dir"] = str(ipython_dir)
    return kernel_profile["ipython_dir"]


def on_config(config):
    plugin = config.plugins.get(JUPYTER_PLUGIN)
    if plugin is None:
        return config
    os.environ["IPYTHONDIR"] = quiet_kernel_profile()
    root = project_root(config)
    if command_seen["command"] == "serve":
        cache_root = root / ".cache" / "mkdocs-jupyter"
        cache_dir = cache_root / package_hash(root)
        for stale in cache_root.glob("*"):  # outputs of an older package version
            if stale.is_dir() and stale != cache_dir:
                shutil.rmtree(stale, ignore_errors=True)
        plugin.config["cache"] = True
        plugin.config["cache_dir"] = str(cache_dir)
        log.info("mkdocs serve: caching executed examples in %s", cache_dir)
    else:
        plugin.config["cache"] = False
    if importlib.util.find_spec("triton") is None:  # Triton ships wheels for Linux x86-64 only
        plugin.config["execute_ignore"] = [*plugin.config["execute_ignore"], f"{EXAMPLES_DIR}/triton_flash.py"]
        log.warning("Triton is not installed (it ships wheels for Linux x86-64): the FlashAttention in Triton page "
                    "shows its code unexecuted")
    if only := os.environ.get("ATTENTION_DOCS_EXECUTE"):
        wanted = {name.strip() for name in only.split(",")}
        plugin.config["execute_ignore"] = [f"{EXAMPLES_DIR}/{script.name}" for script in (root / EXAMPLES_DIR).glob("*.py")
                                           if script.stem not in wanted]
        log.warning("ATTENTION_DOCS_EXECUTE=%s: the other examples are shown unexecuted", only)
    return config


@event_priority(100)  # before mkdocs-jupyter's on_files wraps the scripts as notebook pages
def on_files(files, config):
    root = project_root(config)
    jupyter = config.plugins.get(JUPYTER_PLUGIN)
    for script in sorted((root / EXAMPLES_DIR).glob("*.py")):
        src_uri = f"{EXAMPLES_DIR}/{script.name}"
        file = File(src_uri, src_dir=str(root), dest_dir=config.site_dir, use_directory_urls=config.use_directory_urls)
        files.append(file)
        if jupyter is None or not jupyter.should_include(file):
            continue  # published as a plain file (mkdocs-jupyter `ignore`), not as a page
        notebook = jupytext.read(script)
        notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        # Beside the page (examples/<name>/index.html), where mkdocs-jupyter copies the script.
        notebook_uri = f"{EXAMPLES_DIR}/{script.stem}/{script.stem}.ipynb"
        files.append(File.generated(config, notebook_uri, content=jupytext.writes(notebook, fmt="ipynb")))
    return files


def on_page_context(context, page, config, nav):
    """Give notebook pages the names of their two downloads (read by docs/_overrides/main.html)."""
    if page.file.src_uri.startswith(f"{EXAMPLES_DIR}/") and page.file.src_uri.endswith(".py") and hasattr(page, "nb_url"):
        stem = pathlib.PurePosixPath(page.file.src_uri).stem
        page.example_downloads = {"script": f"{stem}.py", "notebook": f"{stem}.ipynb"}
    return context


MATHJAX_BLOCK = re.compile(r"<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->", re.DOTALL)
MERMAID_SCRIPT = re.compile(r'<script type="module">(?:(?!</script>).)*?mermaid(?:(?!</script>).)*</script>', re.DOTALL)


def on_page_content(html, page, config, files):
    if 'class="jupyter-wrapper"' not in html:
        return html
    html, mathjax_count = MATHJAX_BLOCK.subn("", html)
    html, mermaid_count = MERMAID_SCRIPT.subn("", html)
    if mathjax_count != 1 or mermaid_count != 1:
        log.warning("%s: expected one MathJax and one Mermaid loader to remove, found %d and %d "
                    "(did nbconvert's template change?)", page.file.src_uri, mathjax_count, mermaid_count)
    return html
