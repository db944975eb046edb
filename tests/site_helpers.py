"""Helpers for tests/test_site.py: serve a built site, list its pages, classify URLs.

Plain Python (no browser, no pytest) so each piece can be tried on its own.
"""

import functools
import html.parser
import http.server
import pathlib
import threading
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET

LOCAL_HOSTS = {"localhost", "127.0.0.1"}
HARMLESS_SCHEMES = {"data", "blob", "about", "chrome-extension", "devtools"}


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """A static file handler that does not print one line per request."""

    def log_message(self, format, *args):  # noqa: A002 (the stdlib's argument name)
        pass


class SiteServer:
    """Serves `site_dir` on 127.0.0.1 on a free port, from a background thread.

    Use as a context manager; `base_url` ends with "/".
    """

    def __init__(self, site_dir):
        handler = functools.partial(QuietHandler, directory=str(site_dir))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="site-server", daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc_info):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


def is_offsite(url):
    """True for a request that leaves this machine (anything but localhost, data:, blob:)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme in HARMLESS_SCHEMES:
        return False
    return parts.hostname not in LOCAL_HOSTS


def strip_fragment(url):
    return urllib.parse.urldefrag(url)[0]


def short(url, limit=120):
    """A URL fit for an error message (data: URIs are long)."""
    return url if len(url) <= limit else url[: limit - 3] + "..."


def sitemap_pages(site_dir):
    """Page paths relative to the site root ("", "examples/einsum/") from sitemap.xml.

    None without a sitemap or with an empty one (mkdocs writes no URLs when `site_url` is unset).
    """
    sitemap = pathlib.Path(site_dir) / "sitemap.xml"
    if not sitemap.exists():
        return None
    locs = [el.text.strip() for el in ET.parse(sitemap).getroot().iter() if el.tag.endswith("loc") and el.text]
    paths = [urllib.parse.urlsplit(loc).path for loc in locs]
    if not paths:
        return None
    root = min(paths, key=len)  # the home page: every other page lies below it
    return sorted(path[len(root):] for path in paths if path.startswith(root))


def html_pages_on_disk(site_dir):
    """Page paths relative to the site root for every HTML file the build wrote, except 404.html."""
    site_dir = pathlib.Path(site_dir)
    pages = []
    for path in site_dir.rglob("*.html"):
        rel = path.relative_to(site_dir).as_posix()
        if rel == "404.html":
            continue
        pages.append(rel[: -len("index.html")] if rel.endswith("index.html") else rel)
    return sorted(pages)


class IdCollector(html.parser.HTMLParser):
    """Every `id` (and `<a name>`) in an HTML document: the valid targets of `#fragment` links."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids = set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if value and (name == "id" or (name == "name" and tag == "a")):
                self.ids.add(value)


def element_ids(html_text):
    collector = IdCollector()
    collector.feed(html_text)
    return collector.ids


def fetch(url, timeout=20):
    """(status, content type, text or None) of a GET; redirects are followed, errors are statuses."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            content_type = response.headers.get("Content-Type", "")
            body = response.read()
            text = body.decode("utf-8", "replace") if "html" in content_type else None
            return response.status, content_type, text
    except urllib.error.HTTPError as error:
        return error.code, "", None
    except (urllib.error.URLError, OSError) as error:
        return f"no response ({error})", "", None


# Runs in the page: brings every image into view (so `loading="lazy"` ones load), waits for each,
# and returns the ones that did not load, have no alt text (nbconvert's placeholder counts as none)
# or are laid out with no size. An image that is not rendered (inside a closed <details> or an
# inactive tab) cannot be scrolled to; it is checked by loading its URL into a new Image.
CHECK_IMAGES_JS = """
async (perImageTimeoutMs) => {
  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
  // checkVisibility() is false inside a closed <details> too (content-visibility: hidden).
  const rendered = (img) => (img.checkVisibility ? img.checkVisibility() : img.getClientRects().length > 0);
  const images = Array.from(document.images);
  for (const img of images) {
    if (img.complete || !rendered(img)) continue;
    img.scrollIntoView({block: "center"});
    const deadline = performance.now() + perImageTimeoutMs;
    while (!img.complete && performance.now() < deadline) await sleep(25);
  }
  window.scrollTo(0, 0);
  const describe = (img) => (img.currentSrc || img.getAttribute("src") || "(no src)");
  const broken = [];
  for (const img of images) {
    if (img.complete && img.naturalWidth > 0) continue;
    if (img.complete) {
      // An SVG without intrinsic size reports naturalWidth 0 yet decodes; a broken image does not.
      try { await img.decode(); continue; } catch (e) {}
      broken.push(describe(img) + " (broken: naturalWidth 0)");
    } else if (!rendered(img)) {
      const probe = new Image();
      probe.src = img.currentSrc || img.src;
      try { await probe.decode(); if (probe.naturalWidth > 0) continue; } catch (e) {}
      broken.push(describe(img) + " (hidden image that does not load)");
    } else {
      broken.push(describe(img) + ` (not loaded after ${perImageTimeoutMs} ms, loading=${img.loading})`);
    }
  }
  const placeholder = "No description has been provided for this image";
  for (const img of images) {
    const alt = (img.getAttribute("alt") || "").trim();
    if (!alt || alt === placeholder) broken.push(describe(img) + " (no alt text)");
    const box = img.getBoundingClientRect();
    if (rendered(img) && (box.width < 1 || box.height < 1)) broken.push(describe(img) + ` (laid out ${box.width}x${box.height})`);
  }
  return {count: images.length, broken};
}
"""

# mkdocs-material's copy button on a code block: `button.md-clipboard` up to 9.6, a
# `nav.md-code__nav > button.md-code__button[data-md-type=copy]` since; either names its code
# in `data-clipboard-target`.
# What a reader on a phone would see cut off or have to scroll the page for, at the current viewport:
# the page scrolling sideways, and any element of the content that reaches past the screen's edge
# without a scrolling box (a table's wrapper, a code block, a notebook output) around it that fits;
# and printed text (show_shape) that wraps, which breaks its aligned columns. Each entry names the
# element, its width and how far past the edge it reaches.
PHONE_WIDTH_JS = """
() => {
  const width = document.documentElement.clientWidth;
  const problems = [];
  if (document.documentElement.scrollWidth > width + 1) {
    problems.push(`the page scrolls sideways: ${document.documentElement.scrollWidth}px wide on a ${width}px screen`);
  }
  const content = document.querySelector('.md-content');
  if (!content) return problems;
  const scrolls = (el) => ['auto', 'scroll', 'hidden', 'clip'].includes(getComputedStyle(el).overflowX);
  const describe = (el) => el.tagName.toLowerCase() + (el.className && typeof el.className === 'string'
    ? '.' + el.className.trim().split(/\\s+/).slice(0, 2).join('.') : '') + (el.alt ? ` "${el.alt.slice(0, 60)}"` : '');
  const seen = new Set();
  for (const el of content.querySelectorAll('*')) {
    const box = el.getBoundingClientRect();
    if (box.width === 0 || (box.right <= width + 1 && box.left >= -1)) continue;
    let clipped = false;  // inside a box that scrolls or clips, which itself is checked
    for (let up = el.parentElement; up && up !== content; up = up.parentElement) {
      if (scrolls(up)) { clipped = true; break; }
    }
    if (clipped) continue;
    let outer = el;  // report the outermost offender only
    while (outer.parentElement && outer.parentElement !== content && seen.has(outer.parentElement)) outer = outer.parentElement;
    seen.add(el);
    if (outer !== el) continue;
    problems.push(`${describe(el)}: ${Math.round(box.width)}px wide, reaches ${Math.round(box.right)}px on a ${width}px screen`);
  }
  for (const img of content.querySelectorAll('img')) {  // a figure is never wider than the screen, scrolling or not
    const box = img.getBoundingClientRect();
    if (box.width > width + 1) problems.push(`${describe(img)}: an image ${Math.round(box.width)}px wide on a ${width}px screen`);
  }
  for (const pre of content.querySelectorAll('.jp-RenderedText pre')) {
    const wrap = getComputedStyle(pre).whiteSpace;
    if (wrap !== 'pre') { problems.push(`printed text wraps (white-space: ${wrap}): its columns break`); break; }
  }
  return problems.slice(0, 20);
}
"""

COPY_BUTTON = "button.md-clipboard, button.md-code__button[data-md-type=copy]"

# Runs in the page: what one page offers to check.
PAGE_FACTS_JS = """
(copyButton) => {
  const content = document.querySelector(".md-content") || document.body;
  // Markdown code blocks: mkdocs-material adds a copy button inside each <pre>.
  const blocks = Array.from(content.querySelectorAll("pre > code"))
    .filter((code) => !code.closest(".jupyter-wrapper"));
  // Notebook code cells (mkdocs-jupyter): a <clipboard-copy for="cell-N"> beside each input.
  const cells = Array.from(content.querySelectorAll(".jupyter-wrapper .jp-CodeCell .jp-InputArea .highlight-ipynb"));
  return {
    title: document.title.trim(),
    h1: Array.from(document.querySelectorAll("h1")).map((h) => h.textContent.trim()),
    links: Array.from(document.querySelectorAll("a[href]")).map((a) => a.href),
    codeBlocks: blocks.length,
    codeBlocksWithoutCopy: blocks.filter((code) => !code.parentElement.querySelector(copyButton)).length,
    notebookCells: cells.length,
    notebookCellsWithoutCopy: cells
      .filter((cell) => !cell.closest(".jp-InputArea").querySelector("clipboard-copy[for]")).length,
  };
}
"""

# Runs in the home page: every link of the primary navigation, with its title and its sections.
NAV_LINKS_JS = """
() => Array.from(document.querySelectorAll("nav.md-nav--primary a.md-nav__link[href]"))
  .filter((a) => !a.closest(".md-nav--secondary"))  // the table of contents of the current page
  .map((a) => {
    const sections = [];
    for (let li = a.closest("li.md-nav__item--nested"); li; li = li.parentElement.closest("li.md-nav__item--nested")) {
      const label = li.querySelector(":scope > label.md-nav__link, :scope > .md-nav__link");
      if (label) sections.unshift(label.textContent.trim());
    }
    return {url: a.href, title: a.textContent.trim(), sections};
  })
"""
