"""The site's weight (issue 33): pages that load fast, shared files that a browser caches.

On the built site (`built_site`, conftest.py): no HTML page over 300 KB, no inline `<style>` over
20 KB, no `data:` image over 10 KB, every image a page references exists, the executed pages link
one notebook stylesheet instead of inlining it and show their figures as lazily loaded files with a
size and alt text, and the Benchmarks page states the site's real size. The hook that does it
(docs/_hooks/page_weight.py) is tested piece by piece first, without a build.
"""

import html
import importlib.util
import io
import pathlib
import re
import urllib.parse

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
HOOK_PATH = ROOT / "docs" / "_hooks" / "page_weight.py"
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))

MAX_PAGE_BYTES = 300_000
MAX_STYLE_BYTES = 20_000
MAX_DATA_IMAGE_BYTES = 10_000


@pytest.fixture(scope="module")
def hook():
    spec = importlib.util.spec_from_file_location("page_weight_under_test", HOOK_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------------------------
# The hook, piece by piece
# ----------------------------------------------------------------------------------------------


def test_used_rules_drops_only_rules_that_cannot_match(hook):
    css = (".page .used{color:red}"
           ".page .unused{color:blue}"
           ".unused,.page{margin:0}"  # one selector can match: the whole list stays
           ".page:not(.unused){padding:0}"  # :not() needs nothing
           ":is(.unused, .other) p{padding:1px}"
           "[class~=unused]{padding:2px}"
           "#missing .page{padding:3px}"
           "#here{padding:4px}"
           "table{width:max-content}"
           "@media (max-width: 10px){.unused{color:green}.used{color:black}}"
           "@media print{.unused{color:white}}"
           "@font-face{font-family:x;src:local(x)}"
           ".page :root{--never: 1}:root{--always: 1}.page>:root{--never: 2}")
    kept = "".join(hook.used_rules(css, {".page", ".used", "#here"}))
    for rule in (".page .used{color:red}", ".unused,.page{margin:0}", ".page:not(.unused){padding:0}",
                 ":is(.unused, .other) p{padding:1px}", "[class~=unused]{padding:2px}", "#here{padding:4px}",
                 "table{width:max-content}", "@font-face{font-family:x;src:local(x)}", ":root{--always: 1}"):
        assert rule in kept, rule
    assert "@media (max-width: 10px){.used{color:black}}" in kept
    for gone in (".page .unused", "#missing", "@media print", "color:green", "--never"):
        assert gone not in kept, gone


def test_of_identical_rules_the_later_one_stays(hook):
    assert hook.without_overridden_copies(["a{x:1}", "b{x:2}", "a{x:1}", "c{x:3}"]) == ["b{x:2}", "a{x:1}", "c{x:3}"]


def test_take_styles_moves_the_notebook_styles_only(hook):
    content = ('<script>x()</script>\n<style type="text/css">\n  .a{color:red}\n</style>\n'
               '<style type="text/css">.b{}</style>\n<div class="jupyter-wrapper">'
               '<style type="text/css">.output-own{}</style></div>')
    styles, rest = hook.take_styles(content)
    assert [css.strip() for css in styles] == [".a{color:red}", ".b{}"]
    assert rest == '<script>x()</script>\n<div class="jupyter-wrapper"><style type="text/css">.output-own{}</style></div>'
    assert hook.take_styles("<p>no notebook</p>") == ((), "<p>no notebook</p>")


def test_figures_become_lossless_webp_files(hook):
    """A figure as `attention.display.show` emits it: the WebP written has the PNG's exact pixels."""
    pytest.importorskip("matplotlib")
    from PIL import Image

    from attention.masks import causal
    from attention.plotting import figure_png, plot_mask

    png, _, _ = figure_png(plot_mask(causal, q_len=8))
    image, extension = hook.web_image(png, "png")
    assert extension == "webp" and len(image) < len(png)
    with Image.open(io.BytesIO(png)) as original, Image.open(io.BytesIO(image)) as written:
        assert written.size == original.size
        assert written.convert("RGBA").tobytes() == original.convert("RGBA").tobytes()


def test_write_figures_references_files_beside_the_page(hook, tmp_path, monkeypatch):
    from mkdocs.config import load_config
    from mkdocs.structure.files import File, Files
    from mkdocs.structure.pages import Page

    from attention.masks import causal
    from attention.plotting import figure_html, plot_mask

    config = load_config(str(ROOT / "mkdocs.yml"), site_dir=str(tmp_path))
    monkeypatch.setattr(config.plugins, "_current_plugin", "page_weight", raising=False)  # set by MkDocs during events
    page = Page(None, File("examples/masks.py", src_dir=str(ROOT), dest_dir=str(tmp_path), use_directory_urls=True), config)
    page.file.dest_uri = "examples/masks/index.html"  # as mkdocs-jupyter makes it
    files = Files([])
    hook.on_pre_build(config)
    figure = figure_html(plot_mask(causal, q_len=8), alt='A causal "mask"')
    png = re.search(r'src="data:image/png;base64,([^"]+)"', figure)[1]
    nbconvert_style = f'<img alt="An image output" src="data:image/png;base64,{png}"/>'  # no size, XHTML-style end
    out = hook.write_figures(f"<div>{figure}{figure}</div>{nbconvert_style}", page, config, files)
    images = re.findall(r"<img\b[^>]*>", out)
    assert len(images) == 3 and "data:" not in out
    width, height = re.search(r'width="(\d+)" height="(\d+)"', figure).groups()
    assert images[2].endswith("/>") and f'width="{2 * int(width)}" height="{2 * int(height)}"' in images[2], images[2]
    for index, tag in enumerate(images[:2], start=1):
        src = re.search(r'src="([^"]+)"', tag)[1]
        assert re.fullmatch(rf"figure-{index}\.[0-9a-f]{{10}}\.webp", src), src
        assert files.get_file_from_path(f"examples/masks/{src}") is not None
        for attribute in ('loading="lazy"', 'alt="A causal &quot;mask&quot;"', 'class="attention-figure"'):
            assert attribute in tag, tag
        assert re.search(r'width="\d+" height="\d+"', tag), tag


def markdown_table_html(text):
    import markdown

    return markdown.markdown(text, extensions=["tables"], extension_configs={"tables": {"use_align_attribute": True}})


def test_right_aligned_columns_are_named_once_on_the_table(hook):
    source = markdown_table_html("| # | name | ms | note | MiB |\n|--:|---|--:|:-:|--:|\n| 1 | `a` | 3.5 | x | 10 |\n"
                                 "| 2 | `b` | 12 | y | 20 |\n")
    assert source.count('align="right"') == 9  # three columns, a header and two rows each
    light = hook.right_aligned_columns(source)
    assert '<table data-right="1 3 5">' in light and 'align="right"' not in light
    assert light.count('align="center"') == source.count('align="center"') == 3  # not ours to move
    assert light.replace('<table data-right="1 3 5">', "<table>") == source.replace(' align="right"', "")
    assert len(light) < len(source)


def test_right_aligned_columns_leaves_what_it_cannot_say_once(hook):
    no_right = markdown_table_html("| a | b |\n|---|:-:|\n| 1 | 2 |\n")
    assert hook.right_aligned_columns(no_right) == no_right
    classed = '<table class="dataframe"><tr><td align="right">1</td></tr></table>'  # not Python-Markdown's
    assert hook.right_aligned_columns(classed) == classed
    ragged = '<table><tr><td align="right">1</td><td align="right">2</td></tr><tr><td align="right">3</td></tr></table>'
    assert hook.right_aligned_columns(ragged) == ragged
    width = hook.RIGHT_ALIGNED_MAX_COLUMN + 1
    wide = markdown_table_html("|" + "|".join(f" c{i} " for i in range(width)) + "|\n|" + "--:|" * width + "\n|"
                               + "|".join(f" {i} " for i in range(width)) + "|\n")
    light = hook.right_aligned_columns(wide)
    assert f'data-right="{" ".join(str(n) for n in range(1, width))}"' in light
    assert light.count('align="right"') == 2  # the last column's header and cell keep theirs


def test_the_stylesheet_aligns_every_column_a_table_can_name(hook):
    css = (ROOT / "docs" / "stylesheets" / "extra.css").read_text(encoding="utf-8")
    for column in range(1, hook.RIGHT_ALIGNED_MAX_COLUMN + 1):
        rule = (f'.md-typeset table:not([class])[data-right~="{column}"] :is(td, th):nth-child({column}) '
                "{ text-align: right; }")
        assert rule in css, rule


def test_site_size_counts_the_page_that_states_it(hook, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "index.html").write_bytes(b"x" * 5000)
    (tmp_path / "big.bin").write_bytes(b"y" * 123_456)
    page = tmp_path / "index.html"
    page.write_bytes(b"<p>before</p>" + hook.SITE_SIZE_MARK.encode() + b"<p>after</p>")
    page.write_bytes(hook.fill_site_size(tmp_path, "index.html", page.read_bytes()))
    text = page.read_text(encoding="utf-8")
    assert hook.SITE_SIZE_MARK not in text
    total = sum(path.stat().st_size for path in tmp_path.rglob("*") if path.is_file())
    assert f'data-bytes="{total}"' in text
    assert 'data-page="a/index.html" data-bytes="5000"' in text and 'href="a/"' in text


def test_human_bytes(hook):
    assert [hook.human_bytes(n) for n in (999, 1000, 12_345, 123_456, 4_560_000, 33_000_000)] == [
        "999 bytes", "1 kB", "12.3 kB", "123 kB", "4.56 MB", "33 MB"]


# ----------------------------------------------------------------------------------------------
# The built site
# ----------------------------------------------------------------------------------------------

STYLE = re.compile(r"<style\b[^>]*>(.*?)</style>", re.DOTALL | re.IGNORECASE)
DATA_URI_IMAGE = re.compile(r"data:image/[\w.+-]+(?:;[\w=-]+)*,[^\"')\s]*")
IMG = re.compile(r"<(?:img|source)\b[^>]*>", re.IGNORECASE)
ATTRIBUTE = re.compile(r'\b(?P<name>[\w-]+)\s*=\s*"(?P<value>[^"]*)"')


def site_pages(site):
    return sorted(pathlib.Path(site).rglob("*.html"))


def attributes(tag):
    return {match["name"].lower(): html.unescape(match["value"]) for match in ATTRIBUTE.finditer(tag)}


@pytest.mark.slow
def test_no_page_is_heavy(built_site):
    sizes = {page.relative_to(built_site).as_posix(): page.stat().st_size for page in site_pages(built_site)}
    heavy = [f"{name}: {size:,} bytes" for name, size in sorted(sizes.items()) if size > MAX_PAGE_BYTES]
    print(f"\nlargest page: {max(sizes, key=sizes.get)}, {max(sizes.values()):,} bytes")
    assert not heavy, f"HTML pages over {MAX_PAGE_BYTES:,} bytes:\n" + "\n".join(heavy)


@pytest.mark.slow
def test_markdown_tables_name_their_right_aligned_columns_once(built_site):
    """Every page's Markdown tables: no cell carries `align="right"` where its table could say it once."""
    pages = {page.relative_to(built_site).as_posix(): page.read_text(encoding="utf-8") for page in site_pages(built_site)}
    named = sum(text.count("<table data-right=") for text in pages.values())
    left = [name for name, text in pages.items() if re.search(r'<table>(?:(?!</table>).)*align="right"', text, re.DOTALL)]
    assert named > 20, named  # the Benchmarks page alone has dozens
    assert not left, f"Markdown tables with right-aligned cells, not named on the table: {left}"


@pytest.mark.slow
def test_no_large_inline_style_or_data_image(built_site):
    problems = []
    for page in site_pages(built_site):
        text = page.read_text(encoding="utf-8")
        name = page.relative_to(built_site).as_posix()
        problems += [f"{name}: a <style> of {len(css.encode()):,} bytes" for css in STYLE.findall(text)
                     if len(css.encode()) > MAX_STYLE_BYTES]
        problems += [f"{name}: a data: image of {len(uri):,} bytes ({uri[:40]}...)" for uri in DATA_URI_IMAGE.findall(text)
                     if len(uri) > MAX_DATA_IMAGE_BYTES]
    assert not problems, "\n".join(problems)


def image_urls(tag):
    found = attributes(tag)
    urls = [found["src"]] if "src" in found else []
    urls += [candidate.split()[0] for candidate in found.get("srcset", "").split(",") if candidate.strip()]
    return urls


@pytest.mark.slow
def test_every_image_file_referenced_exists(built_site):
    site = pathlib.Path(built_site)
    missing, checked = [], 0
    for page in site_pages(site):
        page_url = page.relative_to(site).as_posix()
        for tag in IMG.findall(page.read_text(encoding="utf-8")):
            for url in image_urls(tag):
                parts = urllib.parse.urlsplit(url)
                if parts.scheme or parts.netloc:
                    continue  # data: images (checked above); other hosts are test_docs.py's business
                target = site / urllib.parse.unquote(urllib.parse.urljoin(page_url, parts.path)).lstrip("/")
                if target.is_dir():
                    target = target / "index.html"
                checked += 1
                if not target.is_file():
                    missing.append(f"{page_url}: {url}")
    assert checked >= 10, f"found only {checked} image files referenced"
    assert not missing, "images that reference no file:\n" + "\n".join(missing)


@pytest.mark.slow
def test_executed_pages_link_one_stylesheet_and_lazy_figure_files(built_site):
    site = pathlib.Path(built_site)
    stylesheets, figures, problems = set(), 0, []
    for script in EXAMPLES:
        page = site / "examples" / script.stem / "index.html"
        text = page.read_text(encoding="utf-8")
        links = re.findall(r'<link rel="stylesheet" href="([^"]*notebook\.[0-9a-f]+\.css)">', text)
        if len(links) != 1:
            problems.append(f"{script.name}: {len(links)} notebook stylesheet links")
            continue
        head = text.split("</head>", 1)[0]
        if links[0] not in head or head.index(links[0]) < head.index("extra.css"):
            problems.append(f"{script.name}: the notebook stylesheet is not linked in <head> after extra.css")
        stylesheets.add((page.parent / links[0]).resolve())
        for tag in re.findall(r'<img\b[^>]*class="attention-figure"[^>]*>', text):
            figures += 1
            found = attributes(tag)
            if not re.fullmatch(r"figure-\d+\.[0-9a-f]{10}\.(?:webp|png)", found.get("src", "")):
                problems.append(f"{script.name}: figure src {found.get('src', '')[:60]!r}")
            if found.get("loading") != "lazy" or not found.get("alt", "").strip():
                problems.append(f"{script.name}: figure without loading=lazy or alt text: {tag[:200]}")
            if not (found.get("width", "").isdigit() and found.get("height", "").isdigit()):
                problems.append(f"{script.name}: figure without width and height: {tag[:200]}")
    assert not problems, "\n".join(problems)
    assert len(stylesheets) == 1, f"executed pages link different notebook stylesheets: {sorted(stylesheets)}"
    (stylesheet,) = stylesheets
    css = stylesheet.read_text(encoding="utf-8")
    assert ".jp-OutputArea" in css and ".highlight-ipynb" in css, "the stylesheet lacks the notebook's rules"
    assert figures >= 10, figures


@pytest.mark.slow
def test_the_contributing_page_states_the_real_site_size(built_site):
    site = pathlib.Path(built_site)
    text = (site / "contributing" / "index.html").read_text(encoding="utf-8")
    paragraph = re.search(r'<p class="attention-site-size">.*?</p>', text, re.DOTALL)
    assert paragraph, "the Contributing page does not state the site's size"
    assert "attention-site-size" not in (site / "benchmarks" / "index.html").read_text(encoding="utf-8")
    files = [path for path in site.rglob("*") if path.is_file()]
    total = sum(path.stat().st_size for path in files)
    pages = {path.relative_to(site).as_posix(): path.stat().st_size for path in site_pages(site)}
    pages.pop("404.html", None)
    largest = max(pages, key=lambda name: (pages[name], name))
    stated = paragraph.group(0)
    assert f'<strong data-bytes="{total}">' in stated, (total, stated)
    assert f'data-page="{largest}" data-bytes="{pages[largest]}"' in stated, (largest, pages[largest], stated)
    assert f"in {len(files)} files, {len(pages)} of them HTML pages" in stated, stated
