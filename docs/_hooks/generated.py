"""MkDocs hook: what pages say that is generated from the code or the build, so it cannot drift.

`on_config` records what the site is built from (git commit, date, torch and Python versions) for
the footer of every page (docs/_overrides/partials/copyright.html), and takes `site_url` from the
`SITE_URL` environment variable when set (the deploy workflow sets the GitHub Pages address).

`on_page_markdown` replaces these placeholders:

* `<!-- quick-profile -->` (getting-started.md): the benchmark's quick profile, from `quick_config`.
* `<!-- class-limits -->` (index.md): which registered classes refuse which constructor arguments,
  found by building each class with them and catching the error it raises.
* `<!-- registry-table -->` (api/registry.md): every registered name, its class, file and summary.
"""

import datetime
import inspect
import os
import platform
import subprocess
import warnings

# Constructor calls that some classes refuse on purpose: (what, positional arguments).
LIMIT_PROBES = (("dropout > 0", (64, 64, 32, 0.1, 4)), ("d_in != d_out", (48, 64, 32, 0.0, 4)))


def on_config(config):
    if os.environ.get("SITE_URL"):
        config["site_url"] = os.environ["SITE_URL"]
    import torch

    root = os.path.dirname(os.path.abspath(config.config_file_path))

    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30,
                                  check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    config.extra["build"] = {
        "commit": git("rev-parse", "--short=12", "HEAD") or "not a git checkout",
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
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


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == "getting-started.md":
        from attention.bench import render

        return markdown.replace("<!-- quick-profile -->", render.quick_profile_summary())
    if page.file.src_uri == "index.md":
        return markdown.replace("<!-- class-limits -->", class_limits())
    if page.file.src_uri == "api/registry.md":
        return markdown.replace("<!-- registry-table -->", registry_table())
    return markdown
