"""MkDocs hook: what pages say that is generated from the code or the build, so it cannot drift.

`on_config` records what the site is built from (git commit, date, torch and Python versions) for
the footer of every page (docs/_overrides/partials/copyright.html), takes `site_url` from the
`SITE_URL` environment variable when set (the deploy workflow sets the GitHub Pages address), and
finds the repository the install lines point at (`repository_source`): `REPO_URL` when set (the
deploy workflow sets it from `${{ github.server_url }}/${{ github.repository }}`), else the `origin`
remote of the checkout (a relative one from the checkout's root), else the checkout's own path, so a
copied line always works. A web address also becomes the site's `repo_url` (the repository link in the
header). The theme writes `site_url` and `repo_url` into every page unescaped, so each value is used
only if it has the form of its kind (`source_kind`); another is passed over with a warning naming it.

`on_page_markdown` replaces these placeholders:

* `<!-- install-lines -->` (getting-started.md): the install commands, with the repository's address.
* `<!-- quick-profile -->` (getting-started.md): the benchmark's quick profile, from `quick_config`.
* `<!-- torch-floor -->`, `<!-- torch-pin -->` (getting-started.md): the oldest PyTorch the package
  accepts (pyproject.toml's `torch>=` requirement) and the release the README's commands install.
* `<!-- class-limits -->` (index.md): which registered classes refuse which constructor arguments,
  found by building each class with them and catching the error it raises.
* `<!-- decision-table -->` (index.md): which class to use per use and device, read from the
  recorded results files (`attention.decision.decision_table`).
* `<!-- registry-table -->` (api/registry.md): every registered name, its class, file and summary.
* `<!-- kv-calculator-table -->`, `<!-- kv-calculator-data -->` (kv-calculator.md): each published model's cache at
  common contexts, and the terms the calculator's JavaScript computes it from (`attention.report.kv_calculator`).
* `<!-- output -->` (any page): the standard output of the page's ```python blocks above it, run in
  one namespace per page from the repository root (the tests run the same blocks the same way), shown
  as a text block: what a reader sees under a snippet is what it printed when the site was built.
"""

import contextlib
import datetime
import inspect
import io
import logging
import os
import pathlib
import platform
import re
import shlex
import subprocess
import textwrap
import warnings

log = logging.getLogger("mkdocs.hooks.generated")

# Constructor calls that some classes refuse on purpose: (what, positional arguments).
LIMIT_PROBES = (("dropout > 0", (64, 64, 32, 0.1, 4)), ("d_in != d_out", (48, 64, 32, 0.0, 4)))
# The folder the clone lines clone into: not `attention`, the package's own name, because Python run from
# the folder that holds the clone would import that folder (a namespace package) instead of the package.
CLONE_FOLDER = "attention-repo"
# PyTorch's index of CPU-only wheels: on Linux, PyPI's torch is the CUDA build (several GB).
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
OUTPUT_MARK = "<!-- output -->"
PYTHON_FENCE = re.compile(r"^(?P<indent>[ \t]*)```+[ \t]*(?:python|py)\b[^\n]*\n(?P<body>.*?)^(?P=indent)```+[ \t]*$",
                          re.MULTILINE | re.DOTALL)

state = {"root": None, "source": None}
# A web address a page may use as it is, as a link and in the install commands: the theme's templates do not escape
# `repo_url` or `site_url`, and the install lines are Markdown and shell. Host, port and path only: no quote, angle
# bracket, backtick, whitespace, control or shell character, and no credentials (`user:token@`).
WEB_ADDRESS = re.compile(r"https?://[A-Za-z0-9][A-Za-z0-9.-]*(:[0-9]{1,5})?(/[A-Za-z0-9._~%/+=,-]*)?")
# A git remote that is no web address (ssh, git, file; `git@host:owner/repo`), shown as text, a user name at most.
REMOTE = re.compile(r"(ssh|git|git\+ssh|file)://([A-Za-z0-9._-]+@)?[A-Za-z0-9.-]*(:[0-9]{1,5})?(/[A-Za-z0-9._~%/+=,-]*)?"
                    r"|[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[A-Za-z0-9._~/+=,-]+")
# An absolute path, shown in a code span and a code block, quoted in the clone line, a file:// URL for pip: anything
# but a backtick (the end of the code span) and a control or line-separating character (the end of the block).
PATH = re.compile(r"[^\x00-\x1f\x7f-\x9f`\u2028\u2029]+")


def git(root, *args):
    """The stripped output of `git *args` in `root`, or "" where git or the repository is missing."""
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30,
                              check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def repository_source(root, environ=os.environ):
    """Where the install lines get the code: `REPO_URL`, else the `origin` remote, else the checkout's path; None if
    none of them can be shown (`source_kind`). A value that cannot is passed over with a warning naming it; a
    relative remote is a path from the checkout's root."""
    root = pathlib.Path(root).resolve()
    candidates = [("REPO_URL", environ.get("REPO_URL")), ("the origin remote", git(root, "remote", "get-url", "origin")),
                  ("the checkout's path", str(root))]
    for name, value in candidates:
        if not value:
            continue
        if name == "the origin remote" and source_kind(value) is None and not re.match(r"[^/]*:", value):
            value = str((root / value).resolve())  # a relative path, which git allows as a remote
        if source_kind(value) is not None:
            return value
        log.warning("%s is not used in the install lines: not a web address (https://host/path without quotes, "
                    "angle brackets, backticks, spaces, control characters or credentials), a git remote, or an "
                    "absolute path without backticks or control characters", name)
    return None


def source_kind(source):
    """"web" (an http(s) address a page may link to), "remote" (an ssh, git or file remote, shown as text), "path" (an
    absolute path, shown as text), or None for anything else (`WEB_ADDRESS`, `REMOTE`, `PATH`)."""
    if not source or len(source) > 300:
        return None
    if WEB_ADDRESS.fullmatch(source):
        return "web"
    if REMOTE.fullmatch(source):
        return "remote"
    return "path" if PATH.fullmatch(source) and pathlib.Path(source).is_absolute() else None


def is_web_address(source):
    return source_kind(source) == "web"


def install_lines(source):
    """Markdown: the install commands for `source` (a `source_kind`: a web address, a git remote or an absolute path),
    in content tabs; for None or anything else, the commands with a placeholder where the repository goes."""
    kind = source_kind(source)
    if kind == "web":
        where, clone, pip_source = f"the repository, <{source}>", source, source
    elif kind == "path":  # a checkout without a web address: the commands below name its path
        where = "the checkout this site was built from (local build)"
        clone, pip_source = shlex.quote(source), pathlib.Path(source).as_uri()
    elif kind is not None:
        where = f"the repository (`{source}`: this site was built from a checkout without a web address)"
        clone, pip_source = shlex.quote(source), source
    else:
        where = "the repository this site was built from (its address could not be shown)"
        clone, pip_source = "REPOSITORY", "REPOSITORY"
    requirement = f'"git+{pip_source}"'  # not "attention @ git+...": pip 23 refuses that form for a file:// URL
    return textwrap.dedent(f"""\
        The code is in {where}. Make a virtual environment first, so the install touches nothing else
        (Windows: `.venv\\Scripts\\activate`):

        ```bash
        python -m venv .venv && . .venv/bin/activate
        ```

        === "Use the package"

            ```bash
            python -m pip install {requirement}
            ```

            On Linux, PyPI's `torch` is the CUDA build, several gigabytes. Without an NVIDIA GPU, take
            PyTorch's CPU build instead (as the deploy workflow does):

            ```bash
            python -m pip install --extra-index-url {CPU_INDEX} {requirement}
            ```

        === "From a clone (to work on it)"

            ```bash
            git clone {clone} {CLONE_FOLDER} && cd {CLONE_FOLDER}
            python -m pip install -e .
            ```

            Add `--extra-index-url {CPU_INDEX}` to the install on Linux without an NVIDIA GPU. The
            folder is not called `attention`: Python run from the folder that holds it would import that
            folder instead of the package. The README's two commands (serve the site, run the tests)
            run from inside it.
        """)


def torch_versions(root):
    """`(floor, pin)`: the `torch>=` of pyproject.toml's dependencies and the `torch==` of the README's test command."""
    # A regular expression, not tomllib: the package supports Python 3.10, which has no tomllib.
    pyproject = (pathlib.Path(root) / "pyproject.toml").read_text()
    floor = re.search(r'^dependencies = \[[^\]]*"torch\s*>=\s*([\w.]+)"', pyproject, re.MULTILINE)[1]
    readme = (pathlib.Path(root) / "README.md").read_text()
    command = readme[readme.index("<!-- test command -->"):]
    pin = re.search(r"torch==([\w.]+)", command[:command.index("```", command.index("```") + 3)])[1]
    return floor, pin


def on_config(config):
    if os.environ.get("SITE_URL"):
        if is_web_address(os.environ["SITE_URL"]):
            config["site_url"] = os.environ["SITE_URL"]
        else:  # the theme writes it unescaped into every page's canonical link and the sitemap
            log.warning("SITE_URL is not used as the site's address: not a web address (https://host/path without "
                        "quotes, angle brackets, backticks, spaces, control characters or credentials)")
    import torch

    root = os.path.dirname(os.path.abspath(config.config_file_path))
    state["root"] = root
    state["source"] = repository_source(root)
    if is_web_address(state["source"]):  # the header's repository link on every page, unescaped by the theme
        config["repo_url"] = state["source"]
    config.extra["build"] = {
        "commit": git(root, "rev-parse", "--short=12", "HEAD") or "not a git checkout",
        "dirty": bool(git(root, "status", "--porcelain", "--untracked-files=no")),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    return config


def class_limits():
    import attention

    lines = []
    for name, cls in sorted(attention.IMPLEMENTATIONS.items()):
        refused = []
        for what, args in LIMIT_PROBES:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    cls(*args)
            except (TypeError, ValueError) as error:
                refused.append(f"{what} (`{type(error).__name__}`: {error})")
        if refused:
            lines.append(f"* `{name}` refuses " + "; ".join(refused))
    return "\n".join(lines) if lines else "* none: every class accepts every constructor argument."


def registry_table():
    import attention

    lines = ["| name | class | file | what it is |", "|---|---|---|---|"]
    for name, cls in sorted(attention.IMPLEMENTATIONS.items()):
        module = cls.__module__
        summary = inspect.getdoc(cls).splitlines()[0].replace("|", "\\|")
        page = module.rsplit(".", 1)[-1]
        lines.append(f"| `{name}` | [`{cls.__name__}`](causal/{page}.md) | `{module.replace('.', '/')}.py` | {summary} |")
    return "\n".join(lines)


def decision_table(results_dir):
    """The home page's table, from every recorded results file (default, decode and long profiles)."""
    from attention import report
    from attention.report import decision

    def named(directory):
        return [(path.name, report.load_result(path)) for path in report.find_results(directory)]

    runs = [(name, result) for name, result in named(results_dir) if result["config"]["profile"] == "default"]
    return decision.decision_table(decision.split_by_device(runs), decision.split_by_device(named(results_dir / "decode")),
                                   decision.split_by_device(named(results_dir / "long")))


def snippet_outputs(markdown, root, where):
    """`markdown` with each `OUTPUT_MARK` line replaced by what the ```python blocks above it printed.

    The blocks run in order in one namespace, from `root`, each once; a block is not run twice when two
    marks follow it. A failing block raises, naming `where` and the block's first line.
    """
    if OUTPUT_MARK not in markdown:
        return markdown
    namespace = {"__name__": "__docs__"}
    blocks = list(PYTHON_FENCE.finditer(markdown))
    done, parts, position = 0, [], 0
    for mark in re.finditer(rf"^(?P<indent>[ \t]*){re.escape(OUTPUT_MARK)}[ \t]*$", markdown, re.MULTILINE):
        printed = io.StringIO()
        previous = os.getcwd()
        os.chdir(root)
        try:
            with contextlib.redirect_stdout(printed), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                while done < len(blocks) and blocks[done].end() < mark.start():
                    body = textwrap.dedent(blocks[done]["body"])
                    line = markdown[:blocks[done].start()].count("\n") + 1
                    exec(compile(body, f"{where}:{line}", "exec"), namespace)  # noqa: S102 -- the page's own snippets
                    done += 1
        finally:
            os.chdir(previous)
        indent = mark["indent"]
        text = printed.getvalue().rstrip("\n") or "(nothing printed)"
        block = f'{indent}``` text title="Output (printed when this site was built)"\n'
        block += "".join(f"{indent}{line}\n" for line in text.splitlines()) + f"{indent}```"
        parts += [markdown[position:mark.start()], block]
        position = mark.end()
    return "".join(parts) + markdown[position:]


def on_page_markdown(markdown, page, config, files):
    root = pathlib.Path(state["root"] or os.path.dirname(os.path.abspath(config.config_file_path)))
    uri = page.file.src_uri
    if uri == "getting-started.md":
        from attention import report

        source = state["source"] or repository_source(root)
        floor, pin = torch_versions(root)
        markdown = (markdown.replace("<!-- quick-profile -->", report.profile_summary())
                    .replace("<!-- install-lines -->", install_lines(source))
                    .replace("<!-- torch-floor -->", floor).replace("<!-- torch-pin -->", pin))
    elif uri == "index.md":
        limits = textwrap.indent(class_limits(), "    ")  # inside a collapsed admonition
        markdown = (markdown.replace("<!-- class-limits -->", limits)
                    .replace("<!-- decision-table -->", decision_table(root / "docs" / "results")))
    elif uri == "api/registry.md":
        markdown = markdown.replace("<!-- registry-table -->", registry_table())
    elif uri == "kv-calculator.md":
        from attention.report import kv_calculator

        markdown = (markdown.replace("<!-- kv-calculator-table -->", kv_calculator.contexts_table())
                    .replace("<!-- kv-calculator-data -->", kv_calculator.data_script()))
    return snippet_outputs(markdown, root, uri)
