"""MkDocs hook: executed example pages that load fast (issue 33).

mkdocs-jupyter writes every executed page as one self-contained piece of HTML: the whole JupyterLab
stylesheet (about 575 KB) inlined in `<style>` blocks, and every figure a base64 `data:` URI. Nothing
of it can be cached, and a page of text and a few plots weighs megabytes. This hook takes both out:

* `on_page_content` moves the notebook `<style>` blocks of each executed page out of its HTML and
  writes each figure (`<img src="data:image/...;base64,...">`) as an image file beside its page:
  lossless WebP where that is smaller than the PNG (it is, 2-4 times, for matplotlib figures: the
  same pixels, so the page looks as before), else the PNG as it came. The `<img>` keeps its width,
  height and alt text (`attention.plotting.figure_html` writes them) and gains `loading="lazy"`, so a
  figure downloads as the reader scrolls to it. File names carry a hash of their bytes: a browser may
  cache them for as long as it likes. The downloads (`.py`, `.ipynb` beside each page) are the
  sources, untouched: run, they display their figures inline as before.
* `on_page_content` also says each Markdown table's right-aligned columns once, on the table
  (`right_aligned_columns`), instead of an `align="right"` on each of their cells.
* `on_env` (after every page's content is rendered, before any page is written) joins the blocks
  into one stylesheet, `assets/stylesheets/notebook.<hash>.css`, keeping only the rules a page of
  this build can use (`used_rules`): a rule is dropped only when each of its selectors needs a class
  or id that no executed page and no theme file (template or script, which may add classes when the
  page runs) contains, or can match nothing at all; of two identical rules only the later one, which
  decides, is kept. `docs/_overrides/main.html` links it from the `<head>` of each executed page,
  after the theme's and `extra.css`: the same cascade as the inlined blocks had, which came last too.
* `on_post_build` (last of all) measures the site as written, the total bytes and the largest page,
  and writes it into the page that holds `<!-- site-size -->` (the Contributing page).
"""

import base64
import hashlib
import html
import io
import logging
import pathlib
import re

import tinycss2
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File
from mkdocs.utils import get_relative_url

log = logging.getLogger("mkdocs.hooks.page_weight")

NOTEBOOK_MARK = '<div class="jupyter-wrapper">'  # nbconvert's styles and scripts come before it
STYLE_BLOCK = re.compile(r'<style type="text/css">(?P<css>.*?)</style>\s*', re.DOTALL)
DATA_IMAGE = re.compile(r'<img\b(?P<before>[^>]*?)\bsrc="data:image/(?P<type>png|jpeg|gif|webp);base64,(?P<data>[A-Za-z0-9+/=\s]+)"'
                        r'(?P<after>[^>]*)>')
CLASS_ATTRIBUTE = re.compile(r'\bclass\s*=\s*(?:"([^"]*)"|\'([^\']*)\')')
ID_ATTRIBUTE = re.compile(r'\bid\s*=\s*(?:"([^"]*)"|\'([^\']*)\')')
SCRIPT_BLOCK = re.compile(r"<script\b[^>]*>(.*?)</script>", re.DOTALL)
WORD = re.compile(r"[A-Za-z_][\w-]*")
STYLESHEET_DIR = "assets/stylesheets"
SITE_SIZE_MARK = "<!-- site-size -->"
# At-rules whose blocks hold rules (pruned inside); every other at-rule is kept as it is.
GROUPING_AT_RULES = {"media", "supports", "layer", "container", "document", "-moz-document"}

# Kept across the rebuilds of `mkdocs serve` (MkDocs loads a hook module once per process).
encoded_images = {}  # sha256 of a data URI's bytes -> (bytes, extension): each figure encoded once
theme_words_cache = {}  # tuple of theme folders -> words in their templates and scripts
state = {}  # per build: see on_pre_build


def on_pre_build(config):
    state.clear()
    state.update(
        styles={},  # page src_uri -> tuple of the page's notebook <style> texts
        markup={},  # page src_uri -> the page's notebook HTML, styles taken out
        stylesheets={},  # tuple of <style> texts -> site URI of the stylesheet written for them
        images_used=set(),  # keys of encoded_images used by this build
    )


# ----------------------------------------------------------------------------------------------
# Tables: a column's right alignment said once, on the table, instead of on each of its cells
# ----------------------------------------------------------------------------------------------

# Python-Markdown writes `align="right"` on every cell of a right-aligned column (mkdocs.yml's `tables`
# option: an attribute, not a style). A benchmark table is mostly such cells: 5,199 of them, 73 KB, on the
# Benchmarks page of 2026-11-27, which went past the 300 KB a page may weigh. docs/stylesheets/extra.css
# aligns the columns a table names in `data-right`, up to this column: one rule per column.
RIGHT_ALIGNED_MAX_COLUMN = 16
RIGHT = ' align="right"'
MARKDOWN_TABLE = re.compile(r"<table>(?P<body>.*?)</table>", re.DOTALL)  # Python-Markdown's: no attributes
TABLE_ROW = re.compile(r"<tr>.*?</tr>", re.DOTALL)
CELL_START = re.compile(r"<t[hd]\b[^>]*>")


def right_aligned_columns(html_text):
    """`html_text` with each Markdown table's right-aligned columns named once on the table, `<table
    data-right="1 3">`, and `align="right"` taken off their cells. A column counts when each of its cells has
    the attribute (Python-Markdown aligns whole columns); a table whose rows differ in length, or a column past
    `RIGHT_ALIGNED_MAX_COLUMN`, keeps its attributes as they are."""

    def table(match):
        rows = [CELL_START.findall(row) for row in TABLE_ROW.findall(match["body"])]
        if not rows or len({len(cells) for cells in rows}) != 1:
            return match[0]
        columns = [index + 1 for index in range(min(len(rows[0]), RIGHT_ALIGNED_MAX_COLUMN))
                   if all(RIGHT in cells[index] for cells in rows)]
        if not columns:
            return match[0]

        def row(row_match):
            numbers = iter(range(1, len(rows[0]) + 1))
            return CELL_START.sub(lambda cell: cell[0].replace(RIGHT, "") if next(numbers) in columns else cell[0],
                                  row_match[0])

        return f'<table data-right="{" ".join(map(str, columns))}">{TABLE_ROW.sub(row, match["body"])}</table>'

    return MARKDOWN_TABLE.sub(table, html_text)


# ----------------------------------------------------------------------------------------------
# Figures: data URIs -> image files beside the page
# ----------------------------------------------------------------------------------------------


def web_image(data, image_type):
    """`(bytes, extension)` for an image of `image_type` ("png", ...): lossless WebP when smaller."""
    if image_type != "png":
        return data, image_type
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        image.load()
        webp = io.BytesIO()
        # Lossless, with the colour of transparent pixels kept too (`exact`): every pixel as in the PNG.
        # method 1 is within 4% of the smallest file (method 6) at a small fraction of its time.
        image.save(webp, "WEBP", lossless=True, exact=True, method=1, quality=50)
    return (webp.getvalue(), "webp") if len(webp.getvalue()) < len(data) else (data, "png")


def image_size(data):
    """`(width, height)` in pixels of image bytes."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return image.size


def write_figures(content, page, config, files):
    """The page's HTML with each data-URI image written to a file beside it and referenced lazily."""
    page_dir = pathlib.PurePosixPath(page.file.dest_uri).parent
    count = 0

    def replace(match):
        nonlocal count
        count += 1
        data = base64.b64decode(match["data"])
        key = hashlib.sha256(data).hexdigest()
        if key not in encoded_images:
            encoded_images[key] = web_image(data, match["type"])
        state["images_used"].add(key)
        image, extension = encoded_images[key]
        uri = (page_dir / f"figure-{count}.{hashlib.sha256(image).hexdigest()[:10]}.{extension}").as_posix()
        if files.get_file_from_path(uri) is None:
            files.append(File.generated(config, uri, content=image))
        attributes = f"{match['before']} {match['after']}"
        extra = ""
        if not re.search(r"\bwidth\s*=", attributes):  # the image's own size: the same layout, known early
            width, height = image_size(data)
            extra += f' width="{width}" height="{height}"'
        if not re.search(r"\bloading\s*=", attributes):
            extra += ' loading="lazy"'
        if not re.search(r"\bdecoding\s*=", attributes):
            extra += ' decoding="async"'
        src = get_relative_url(uri, page.file.dest_uri)
        after = match["after"].rstrip()
        closing = "/" if after.endswith("/") else ""  # XHTML-style `<img ... />` stays so
        return f'<img{match["before"]}src="{html.escape(src)}"{after.removesuffix("/").rstrip()}{extra}{closing}>'

    return DATA_IMAGE.sub(replace, content)


# ----------------------------------------------------------------------------------------------
# The notebook stylesheet
# ----------------------------------------------------------------------------------------------


def split_selectors(prelude):
    """A rule's prelude (tinycss2 component values) as one list of tokens per comma-separated selector."""
    selectors = [[]]
    for token in prelude:
        if token.type == "literal" and token.value == ",":
            selectors.append([])
        else:
            selectors[-1].append(token)
    return selectors


COMBINATORS = {">", "+", "~"}


def required_names(selector):
    """The classes (".name") and ids ("#name") an element must have for `selector` to match it, or
    None when nothing can match it: `:root` below another element (`.jupyter-wrapper :root`, which
    JupyterLab's stylesheet holds 80 KB of) names the document's root as a descendant.

    Only names outside parentheses and brackets count: `:not(.a)`, `:is(.a, .b)` or `[class~=a]`
    do not need `a` (they are left to match, which keeps their rule).
    """
    names, compound_seen, below = set(), False, False
    for previous, token in zip([None, *selector], selector):
        after_literal = previous is not None and previous.type == "literal"
        if token.type == "whitespace" or (token.type == "literal" and token.value in COMBINATORS):
            below = below or compound_seen
            continue
        compound_seen = True
        if token.type == "ident" and after_literal and previous.value == ".":
            names.add(f".{token.value}")
        elif token.type == "hash" and token.is_identifier:
            names.add(f"#{token.value}")
        elif token.type == "ident" and after_literal and previous.value == ":" and token.lower_value == "root" and below:
            return None
    return names


def can_match(selector, present):
    names = required_names(selector)
    return names is not None and names <= present


def used_rules(css, present):
    """The rules of a stylesheet that can match, as a list of CSS texts: `css` less each rule whose
    every selector needs a class or id missing from `present` (a set of ".class" and "#id") or can
    never match, and less at-rule blocks left empty.

    Selector lists are kept whole: dropping one selector of a list could revive a rule that a
    browser ignores because another selector of it is invalid.
    """
    kept = []
    for rule in tinycss2.parse_stylesheet(css, skip_comments=True, skip_whitespace=True):
        if rule.type == "qualified-rule":
            if any(can_match(selector, present) for selector in split_selectors(rule.prelude)):
                kept.append(tinycss2.serialize([rule]))
        elif rule.type == "at-rule" and rule.lower_at_keyword in GROUPING_AT_RULES and rule.content is not None:
            inner = used_rules(tinycss2.serialize(rule.content), present)
            if inner:
                kept.append(f"@{rule.at_keyword}{tinycss2.serialize(rule.prelude)}{{{''.join(inner)}}}")
        elif rule.type == "at-rule" and rule.lower_at_keyword == "charset":
            continue  # written once, first, by notebook_stylesheet
        else:
            kept.append(tinycss2.serialize([rule]))
    return kept


def without_overridden_copies(rules):
    """`rules` less each rule that an identical rule later in the list repeats (JupyterLab's light
    theme comes twice, in its index.css and its theme file): the later copy sets the same values at
    the same specificity, so the earlier one never decides anything."""
    last = {rule: index for index, rule in enumerate(rules)}
    return [rule for index, rule in enumerate(rules) if last[rule] == index]


def names_in_html(markup):
    """Every class and id on an element of `markup`, as ".class" and "#id"."""
    names = set()
    for match in CLASS_ATTRIBUTE.finditer(markup):
        names.update(f".{name}" for name in (match[1] or match[2] or "").split())
    for match in ID_ATTRIBUTE.finditer(markup):
        names.add(f"#{match[1] or match[2]}")
    return names


def words_in(text):
    """Every word of `text`, as a class and as an id: what a script or template might put on an element."""
    words = set(WORD.findall(text))
    return {f".{word}" for word in words} | {f"#{word}" for word in words}


def theme_words(config):
    """Words of the theme's templates and scripts (the page around the notebook, and what its
    JavaScript adds at run time); read once per process."""
    dirs = tuple(config.theme.dirs)
    if dirs not in theme_words_cache:
        words = set()
        for folder in dirs:
            for path in pathlib.Path(folder).rglob("*"):
                if path.suffix in (".html", ".js") and path.is_file():
                    words |= words_in(path.read_text(encoding="utf-8", errors="replace"))
        theme_words_cache[dirs] = words
    return theme_words_cache[dirs]


def notebook_stylesheet(styles, present):
    """The stylesheet that replaces a page's notebook `<style>` blocks: their rules that can match, in order."""
    rules = without_overridden_copies([rule for css in styles for rule in used_rules(css, present)])
    return '@charset "UTF-8";\n' + "\n".join(rules) + "\n"


def take_styles(content):
    """`(styles, content)`: the notebook `<style>` texts in the head of mkdocs-jupyter's HTML, and the
    HTML without them. Styles inside the notebook (an output's own) stay where they are."""
    head, mark, body = content.partition(NOTEBOOK_MARK)
    if not mark:
        return (), content
    styles = tuple(match["css"] for match in STYLE_BLOCK.finditer(head))
    return styles, STYLE_BLOCK.sub("", head) + mark + body


# ----------------------------------------------------------------------------------------------
# MkDocs events
# ----------------------------------------------------------------------------------------------


@event_priority(-50)  # after the other hooks have edited the notebook HTML
def on_page_content(html_text, page, config, files):
    html_text = right_aligned_columns(html_text)
    if NOTEBOOK_MARK not in html_text:
        return html_text
    styles, html_text = take_styles(html_text)
    html_text = write_figures(html_text, page, config, files)
    if styles:
        state["styles"][page.file.src_uri] = styles
        state["markup"][page.file.src_uri] = html_text
    return html_text


def on_env(env, config, files):
    if not state.get("styles"):
        return env
    # What a page could match: the notebook HTML of every page, the scripts inside it, and the theme.
    present = set(theme_words(config))
    for markup in state["markup"].values():
        present |= names_in_html(markup)
        for script in SCRIPT_BLOCK.findall(markup):
            present |= words_in(script)
    for styles in dict.fromkeys(state["styles"].values()):
        css = notebook_stylesheet(styles, present)
        uri = f"{STYLESHEET_DIR}/notebook.{hashlib.sha256(css.encode()).hexdigest()[:10]}.css"
        if files.get_file_from_path(uri) is None:
            files.append(File.generated(config, uri, content=css))
        state["stylesheets"][styles] = uri
        log.info("notebook stylesheet %s: %d of %d bytes kept", uri, len(css.encode()),
                 sum(len(block.encode()) for block in styles))
    for key in set(encoded_images) - state["images_used"]:  # figures no page shows any more (serve)
        del encoded_images[key]
    return env


def on_page_context(context, page, config, nav):
    """Tell docs/_overrides/main.html which stylesheet the page's notebook needs, if any."""
    styles = state.get("styles", {}).get(page.file.src_uri)
    page.notebook_stylesheet = state["stylesheets"].get(styles) if styles else None
    return context


# ----------------------------------------------------------------------------------------------
# The site's size, on the page that asks for it
# ----------------------------------------------------------------------------------------------


def human_bytes(count):
    """Bytes for a reader: "950 bytes", "12.3 kB", "4.56 MB" (decimal units)."""
    if count < 1000:
        return f"{count} bytes"
    for unit, scale in (("kB", 1e3), ("MB", 1e6), ("GB", 1e9)):
        if count < scale * 1000 or unit == "GB":
            value = count / scale
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
    raise AssertionError("unreachable")


def site_size_html(sizes, page_uri):
    """The paragraph that states the site's size: `sizes` maps each file (site-relative) to its bytes."""
    pages = {uri: size for uri, size in sizes.items() if uri.endswith(".html") and uri != "404.html"}
    largest = max(pages, key=lambda uri: (pages[uri], uri))
    total = sum(sizes.values())
    href = get_relative_url(largest, page_uri).removesuffix("index.html") or "./"
    shown = largest.removesuffix("index.html") or "/"
    return (f'<hr>\n<p class="attention-site-size">This site, as this build wrote it: <strong data-bytes="{total}">'
            f"{human_bytes(total)}</strong> in {len(sizes)} files, {len(pages)} of them HTML pages. The largest page is "
            f'<a href="{html.escape(href)}"><code>{html.escape(shown)}</code></a>, '
            f'<span data-page="{html.escape(largest)}" data-bytes="{pages[largest]}">{human_bytes(pages[largest])}</span> '
            "of HTML; its figures and the stylesheets it shares with other pages load as separate, cacheable files.</p>")


def fill_site_size(site_dir, page_uri, content):
    """`content` (the bytes of `page_uri`) with its placeholder replaced by the size of the site in `site_dir`,
    counting the page as it will be once filled in."""
    site_dir = pathlib.Path(site_dir)
    sizes = {path.relative_to(site_dir).as_posix(): path.stat().st_size for path in site_dir.rglob("*") if path.is_file()}
    unfilled = sizes[page_uri]
    paragraph = ""
    for _ in range(10):  # the paragraph's length changes the page's size it states: settle on a fixed point
        sizes[page_uri] = unfilled - len(SITE_SIZE_MARK.encode()) + len(paragraph.encode())
        settled = site_size_html(sizes, page_uri)
        if settled == paragraph:
            return content.replace(SITE_SIZE_MARK.encode(), paragraph.encode(), 1)
        paragraph = settled
    raise RuntimeError("the site-size paragraph does not settle on its own length")


@event_priority(-100)  # last: after the search index and every other file is written
def on_post_build(config):
    site_dir = pathlib.Path(config.site_dir)
    for path in sorted(site_dir.rglob("*.html")):
        content = path.read_bytes()
        if SITE_SIZE_MARK.encode() in content:
            path.write_bytes(fill_site_size(site_dir, path.relative_to(site_dir).as_posix(), content))
