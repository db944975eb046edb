"""The built documentation site, end to end, in a real browser (Chromium driven by Playwright).

Serves the `built_site` (conftest.py) on 127.0.0.1, opens every page of the navigation, and checks
what a reader would notice: pages, titles, images (loaded, sized, with alt text), links and anchors, JavaScript errors, requests
that leave the machine, search, the per-device tabs of the benchmark page, code copy buttons.
Screenshots of a few pages go to $SCREENSHOT_DIR, else to `screenshots/` under pytest's temp dir.

    NO_MKDOCS_2_WARNING=1 python -m pytest tests/test_site.py -s

Needs the `playwright` package and a Chromium at /usr/bin/chromium (or $CHROMIUM_PATH); Playwright's
own browser download is not used. Without them the tests skip, or fail when $CI is set.
"""

import dataclasses
import os
import pathlib
import time
import urllib.parse

import pytest
from site_helpers import (
    CHECK_IMAGES_JS,
    COPY_BUTTON,
    NAV_LINKS_JS,
    PAGE_FACTS_JS,
    PHONE_WIDTH_JS,
    SiteServer,
    element_ids,
    fetch,
    html_pages_on_disk,
    is_offsite,
    short,
    sitemap_pages,
    strip_fragment,
)

pytestmark = pytest.mark.slow

CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    # Chromium's own traffic (updates, safe browsing, sync) would count as requests off the site.
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-quic",
]
DESKTOP = dict(viewport={"width": 1280, "height": 800})
PHONE = dict(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True, device_scale_factor=2)
TIMEOUT_MS = 15_000
IMAGE_TIMEOUT_MS = 5_000

# A search for the word must list a page whose URL contains one of the fragments.
SEARCH_EXPECTATIONS = {
    "einsum": ("einsum",),
    "flash": ("flash", "sdpa"),  # FlashAttention is a backend of scaled_dot_product_attention
}


def _unavailable(reason):
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI must run the browser tests, not skip them")
    pytest.skip(reason)


def _listing(items, limit=60):
    items = list(items)
    text = "\n".join(f"  {item}" for item in items[:limit])
    return text + (f"\n  ... and {len(items) - limit} more" if len(items) > limit else "")


# ----------------------------------------------------------------------------------------------
# Fixtures: one browser, one server, one walk through the site for the whole module
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def browser():
    """Chromium via Playwright. Session scope, listed before `built_site` is needed: a missing
    browser skips the tests before the (minutes-long) site build."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the `playwright` package is not installed (pip install -e '.[browser]')")
    if not pathlib.Path(CHROMIUM).exists():
        _unavailable(f"no Chromium at {CHROMIUM} (install Debian's `chromium`, or set CHROMIUM_PATH)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def server(browser, built_site):
    with SiteServer(built_site) as server:
        yield server


class Recorder:
    """What a browser context did that a test may object to: offsite requests and JS errors.

    Offsite requests are recorded and then aborted, so the tests behave the same with or without
    internet access.
    """

    def __init__(self, base_url):
        self.base_url = base_url
        self.offsite = {}  # "page: request URL" -> None (an ordered set)
        self.js_errors = {}  # "page: message" -> None

    def attach(self, context):
        context.route(is_offsite, lambda route: route.abort())
        context.on("request", self._on_request)
        context.on("page", self._watch)

    def _where(self, url):
        url = url or "?"
        return (url[len(self.base_url):] or "(home)") if url.startswith(self.base_url) else url

    def _watch(self, page):
        page.on("console", lambda message: self._on_console(page, message))
        page.on("pageerror", lambda error: self.js_errors.setdefault(f"{self._where(page.url)}: uncaught {error}"))

    def _on_request(self, request):
        if is_offsite(request.url):
            # While a page loads, its frame has no URL yet; the Referer names the page.
            page = (request.frame.url if request.frame else "") or request.headers.get("referer", "")
            self.offsite.setdefault(f"{self._where(page)}: {short(request.url)}")

    def _on_console(self, page, message):
        if message.type == "error":
            location = message.location or {}
            where = f" ({short(location['url'])}:{location.get('lineNumber', '')})" if location.get("url") else ""
            self.js_errors.setdefault(f"{self._where(page.url)}: console.error: {message.text}{where}")

    def assert_clean(self, what):
        problems = [f"request to {item}" for item in self.offsite] + list(self.js_errors)
        assert not problems, f"{what}: requests off the site or JavaScript errors:\n" + _listing(problems)


@pytest.fixture
def new_context(browser, server):
    """Makes browser contexts with a Recorder each; closes them after the test."""
    made = []

    def make(device=DESKTOP, **options):
        context = browser.new_context(**device, **options)
        context.set_default_timeout(TIMEOUT_MS)
        recorder = Recorder(server.base_url)
        recorder.attach(context)
        made.append(context)
        return context, recorder

    yield make
    for context in made:
        context.close()


@dataclasses.dataclass
class NavEntry:
    url: str
    title: str
    sections: list


@dataclasses.dataclass
class Walk:
    """Everything learned by opening every page once; the tests below assert on it."""

    base_url: str
    nav: list
    pages: list  # absolute URLs, nav order first
    sitemap: list | None
    on_disk: list
    load_problems: list = dataclasses.field(default_factory=list)
    image_problems: list = dataclasses.field(default_factory=list)
    link_problems: list = dataclasses.field(default_factory=list)
    copy_problems: list = dataclasses.field(default_factory=list)
    recorder: Recorder | None = None
    images: int = 0
    links: int = 0
    link_targets: int = 0
    anchors: int = 0
    code_pages: list = dataclasses.field(default_factory=list)  # pages with Markdown code blocks
    notebook_pages: list = dataclasses.field(default_factory=list)  # pages with notebook code cells
    titles: dict = dataclasses.field(default_factory=dict)  # page URL -> <title>

    def rel(self, url):
        return url[len(self.base_url):] if url.startswith(self.base_url) else url

    def nav_page(self, predicate):
        return next((entry.url for entry in self.nav if predicate(entry)), None)


def _visit_pages(page, result, site_url):
    """Opens each page; records page problems in `result`; returns {link target: {fragment: [pages]}}."""
    base = result.base_url
    links = {}  # link target without fragment -> {fragment: [pages linking to it]}
    for url in result.pages:
        try:
            response = page.goto(url)
        except Exception as error:  # a timeout or a crash: report it, walk on
            result.load_problems.append(f"{result.rel(url)}: does not load ({error})")
            continue
        rel = result.rel(url) or "(home)"
        if response is None or response.status != 200:
            result.load_problems.append(f"{rel}: HTTP {response.status if response else 'no response'}")
            continue
        facts = page.evaluate(PAGE_FACTS_JS, COPY_BUTTON)
        result.titles[url] = facts["title"]
        if not facts["title"]:
            result.load_problems.append(f"{rel}: empty <title>")
        if not facts["h1"]:
            result.load_problems.append(f"{rel}: no <h1>")
        images = page.evaluate(CHECK_IMAGES_JS, IMAGE_TIMEOUT_MS)
        result.images += images["count"]
        result.image_problems += [f"{rel}: {short(src)}" for src in images["broken"]]
        if facts["codeBlocksWithoutCopy"]:
            result.copy_problems.append(
                f"{rel}: {facts['codeBlocksWithoutCopy']} of {facts['codeBlocks']} code blocks have no copy button")
        if facts["notebookCellsWithoutCopy"]:
            result.copy_problems.append(
                f"{rel}: {facts['notebookCellsWithoutCopy']} of {facts['notebookCells']} notebook code cells "
                "have no copy button")
        if facts["codeBlocks"]:
            result.code_pages.append(url)
        if facts["notebookCells"]:
            result.notebook_pages.append(url)
        for href in facts["links"]:
            if site_url and href.startswith(site_url):
                href = base + href[len(site_url):]
            if urllib.parse.urlsplit(href).netloc != urllib.parse.urlsplit(base).netloc:
                continue  # another site: not followed (no internet here); never requested either
            result.links += 1
            target, fragment = urllib.parse.urldefrag(href)
            links.setdefault(target, {}).setdefault(urllib.parse.unquote(fragment), []).append(rel)
    return links


@pytest.fixture(scope="module")
def walk(browser, server, built_site):
    """Opens every page of the site once (desktop width) and records what each offers."""
    started = time.perf_counter()
    base = server.base_url
    context = browser.new_context(**DESKTOP)
    context.set_default_timeout(TIMEOUT_MS)
    recorder = Recorder(base)
    recorder.attach(context)
    page = context.new_page()

    response = page.goto(base)
    if response is None or response.status != 200:
        pytest.fail(f"the home page {base} does not load: {response.status if response else 'no response'}")
    nav, seen = [], set()
    for entry in page.evaluate(NAV_LINKS_JS):
        url = strip_fragment(entry["url"])
        if url.startswith(base) and url not in seen:
            seen.add(url)
            nav.append(NavEntry(url, entry["title"], entry["sections"]))
    sitemap = sitemap_pages(built_site)
    on_disk = html_pages_on_disk(built_site)
    pages = [entry.url for entry in nav]
    for rel in (sitemap or []) + on_disk:
        if base + rel not in pages:
            pages.append(base + rel)
    result = Walk(base, nav, pages, sitemap, on_disk, recorder=recorder)

    # The site's own URL (site_url in mkdocs.yml) from the home page's canonical link: absolute
    # links to it are internal links too, checked against the local copy.
    site_url = page.evaluate("() => (document.querySelector('link[rel=canonical]') || {}).href || null")

    try:
        links = _visit_pages(page, result, site_url)
    finally:
        context.close()

    # Each target once; each fragment against the ids of its target page.
    result.link_targets = len(links)
    for target, fragments in sorted(links.items()):
        status, _, text = fetch(target)
        if status != 200:
            pages_linking = sorted({p for linking in fragments.values() for p in linking})
            result.link_problems.append(
                f"{short(target)}: HTTP {status}, linked from {', '.join(pages_linking[:5])}"
                + (f" and {len(pages_linking) - 5} more" if len(pages_linking) > 5 else ""))
            continue
        ids = element_ids(text) if text is not None else set()
        for fragment, linking in sorted(fragments.items()):
            if not fragment:
                continue
            result.anchors += 1
            if fragment not in ids:
                result.link_problems.append(
                    f"{result.rel(target) or '(home)'}#{fragment}: no element with this id, "
                    f"linked from {', '.join(sorted(set(linking))[:5])}")

    print(
        f"\nsite walk: {len(pages)} pages ({len(nav)} in the nav), {result.images} images, "
        f"{result.links} internal links to {result.link_targets} targets, {result.anchors} anchors "
        f"checked in {time.perf_counter() - started:.0f} s")
    return result


# ----------------------------------------------------------------------------------------------
# Every page
# ----------------------------------------------------------------------------------------------


def test_every_nav_page_is_built_and_walked(walk):
    problems = []
    on_disk = {walk.base_url + rel for rel in walk.on_disk}
    in_sitemap = {walk.base_url + rel for rel in walk.sitemap} if walk.sitemap is not None else None
    assert walk.nav, "found no links in the home page's navigation (nav.md-nav--primary)"
    for entry in walk.nav:
        if entry.url not in on_disk:
            problems.append(f"nav entry {entry.title!r} -> {walk.rel(entry.url)}: no HTML file in the build")
        if in_sitemap is not None and entry.url not in in_sitemap:
            problems.append(f"nav entry {entry.title!r} -> {walk.rel(entry.url)}: not in sitemap.xml")
    if in_sitemap is not None:
        problems += [f"{walk.rel(url)}: built but not in sitemap.xml" for url in sorted(on_disk - in_sitemap)]
    assert not problems, "navigation, sitemap.xml and the built HTML files disagree:\n" + _listing(problems)


def test_every_page_loads_with_a_title_and_h1(walk):
    problems = walk.load_problems
    assert not problems, (
        f"pages that fail to load or lack <title>/<h1> ({len(walk.pages)} walked):\n" + _listing(problems))


def test_every_image_loads_with_alt_text_and_a_size(walk):
    problems = walk.image_problems
    assert walk.images, "found no images at all"
    assert not problems, f"images that do not load, lack alt text or have no size ({walk.images} checked):\n" + _listing(problems)


def test_every_internal_link_and_anchor_resolves(walk):
    assert walk.links, "found no internal links at all"
    problems = walk.link_problems
    assert not problems, (
        f"broken internal links or anchors ({walk.link_targets} targets, {walk.anchors} anchors checked):\n"
        + _listing(problems))


def test_no_javascript_errors(walk):
    problems = list(walk.recorder.js_errors)
    assert not problems, "JavaScript errors while walking the site:\n" + _listing(problems)


def test_no_request_leaves_localhost(walk):
    problems = list(walk.recorder.offsite)
    assert not problems, "requests to hosts other than localhost (the site must work offline):\n" + _listing(problems)


def test_every_code_block_has_a_copy_button(walk):
    problems = walk.copy_problems
    assert not problems, "code blocks without a copy button:\n" + _listing(problems)


def test_phone_width_nothing_is_wider_than_the_screen(walk, new_context):
    """At 390 px every page fits the screen: no sideways page scroll, no figure, table or output past the
    edge (wide content scrolls inside its own box), and printed shape walk-throughs keep their lines."""
    context, recorder = new_context(PHONE)
    page = context.new_page()
    problems = []
    for url in walk.pages:
        page.goto(url)
        page.evaluate(CHECK_IMAGES_JS, IMAGE_TIMEOUT_MS)  # images loaded, so they have their laid-out size
        problems += [f"{walk.rel(url) or '(home)'}: {problem}" for problem in page.evaluate(PHONE_WIDTH_JS)]
    assert not problems, f"wider than a {PHONE['viewport']['width']} px screen:\n" + _listing(problems)
    recorder.assert_clean("the phone-width walk")


# ----------------------------------------------------------------------------------------------
# Search, tabs, copy buttons
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("query", sorted(SEARCH_EXPECTATIONS))
def test_search_finds_the_implementation_page(walk, new_context, query):
    fragments = SEARCH_EXPECTATIONS[query]
    expected = [url for url in walk.pages if any(f in walk.rel(url).lower() for f in fragments)]
    assert expected, (
        f"no built page has {' or '.join(fragments)!r} in its URL; pages: {[walk.rel(u) for u in walk.pages]}")
    context, recorder = new_context()
    page = context.new_page()
    page.goto(walk.base_url)
    page.locator("input.md-search__input").click()
    page.locator("input.md-search__input").press_sequentially(query, delay=30)
    results = page.locator(".md-search-result__item a.md-search-result__link")
    try:
        results.first.wait_for(state="visible")
    except Exception:
        meta = page.locator(".md-search-result__meta").all_inner_texts()
        pytest.fail(f"search for {query!r} shows no results within {TIMEOUT_MS} ms (search says: {meta})")
    # A result links to a page with "?h=<query>" (search.highlight) and perhaps a "#section".
    found = [href.split("?")[0].split("#")[0] for href in results.evaluate_all("links => links.map(a => a.href)")]
    assert set(found) & set(expected), (
        f"search for {query!r} lists {[walk.rel(u) for u in found]}, none of the expected pages "
        f"{[walk.rel(u) for u in expected]}")
    recorder.assert_clean(f"search for {query!r}")


def _benchmark_page(walk):
    url = walk.nav_page(lambda entry: "benchmark" in entry.title.lower())
    if url is None:
        nav_urls = {entry.url for entry in walk.nav}
        outside_nav = [f"{walk.rel(page)} ({title!r})" for page, title in walk.titles.items()
                       if "benchmark" in title.lower() and page not in nav_urls]
        pytest.fail("no page with 'Benchmark' in its navigation title; nav titles: "
                    + ", ".join(repr(entry.title) for entry in walk.nav)
                    + (f"; built but not in the nav: {', '.join(outside_nav)}" if outside_nav else ""))
    return url


# Select, outermost first, every tab that encloses a tab set, so the set itself is on screen.
REVEAL_TAB_SET = """set => {
  const blocks = [];
  for (let el = set.parentElement; el; el = el.parentElement) if (el.classList.contains('tabbed-block')) blocks.unshift(el);
  for (const block of blocks) {
    const index = [...block.parentElement.children].indexOf(block);
    block.closest('.tabbed-set').querySelectorAll(':scope > input')[index].click();
  }
}"""


def test_benchmark_tabs_switch_and_show_tables(walk, new_context):
    url = _benchmark_page(walk)
    context, recorder = new_context()
    page = context.new_page()
    page.goto(url)
    tab_sets = page.locator(".tabbed-set")
    assert tab_sets.count(), f"{walk.rel(url)} has no content tabs (.tabbed-set)"
    problems, tabs_checked = [], 0
    for set_index in range(tab_sets.count()):
        tab_set = tab_sets.nth(set_index)
        labels = tab_set.locator(":scope > .tabbed-labels > label")
        blocks = tab_set.locator(":scope > .tabbed-content > .tabbed-block")
        if labels.count() != blocks.count():
            problems.append(f"tab set {set_index}: {labels.count()} labels but {blocks.count()} blocks")
            continue
        for index in range(labels.count()):
            tab_set.evaluate(REVEAL_TAB_SET)  # a nested set (one per results file) sits in a parent tab
            label = labels.nth(index)
            name = f"tab set {set_index}, tab {label.inner_text().strip()!r}"
            label.click()
            block = blocks.nth(index)
            try:
                block.wait_for(state="visible", timeout=3_000)
            except Exception:
                shown = block.evaluate("el => getComputedStyle(el).display !== 'none'")
                problems.append(f"{name}: " + ("its block is shown but empty" if shown else "its block does not show"))
                continue
            others_visible = [i for i in range(blocks.count()) if i != index and blocks.nth(i).is_visible()]
            if others_visible:
                problems.append(f"{name}: blocks {others_visible} stay visible too")
            tables = block.locator("table")
            has_table = tables.count() > 0 and tables.first.is_visible()
            if not has_table and not block.inner_text().strip():
                problems.append(f"{name}: shows neither a table nor any text")
            tabs_checked += 1
    print(f"\nbenchmark tabs: {tabs_checked} tabs in {tab_sets.count()} tab sets checked on {walk.rel(url)}")
    assert not problems, f"content tabs on {walk.rel(url)}:\n" + _listing(problems)
    recorder.assert_clean("the benchmark tabs")


def _clipboard_text(page):
    return page.evaluate("() => navigator.clipboard.readText()")


def _normalize(text):
    return "\n".join(line.rstrip() for line in text.replace("\u00a0", " ").strip("\n").splitlines())


def test_copy_buttons_copy_the_code(walk, new_context):
    assert walk.code_pages or walk.notebook_pages, "no page has a code block"
    context, recorder = new_context()
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=walk.base_url.rstrip("/"))
    page = context.new_page()
    problems, checked = [], []
    if walk.code_pages:  # Markdown code blocks: mkdocs-material's button
        url = walk.code_pages[0]
        page.goto(url)
        button = page.locator(f".md-content pre :is({COPY_BUTTON})").first
        target = button.get_attribute("data-clipboard-target")  # "#__code_0 > code"
        expected = page.locator(target).inner_text()
        page.evaluate("() => navigator.clipboard.writeText('(nothing copied)')")
        page.locator(target).hover()  # the button shows on hover
        button.click()
        page.wait_for_timeout(300)
        copied = _clipboard_text(page)
        if _normalize(copied) != _normalize(expected):
            problems.append(f"{walk.rel(url) or '(home)'}: copied {copied[:200]!r}, the block shows {expected[:200]!r}")
        checked.append(walk.rel(url) or "(home)")
    if walk.notebook_pages:  # notebook code cells: mkdocs-jupyter's <clipboard-copy for="cell-N">
        url = walk.notebook_pages[0]
        page.goto(url)
        button = page.locator(".md-content clipboard-copy[for]").first
        target_id = button.get_attribute("for")
        expected = page.evaluate("id => document.getElementById(id).textContent", target_id)
        page.evaluate("() => navigator.clipboard.writeText('(nothing copied)')")
        button.click()
        page.wait_for_timeout(300)
        copied = _clipboard_text(page)
        if _normalize(copied) != _normalize(expected):
            problems.append(
                f"{walk.rel(url)} (notebook cell): copied {copied[:200]!r}, the cell holds {expected[:200]!r}")
        checked.append(walk.rel(url))
    print(f"\ncopy buttons: tried on {', '.join(checked)}")
    assert not problems, "copy buttons that do not copy the code:\n" + _listing(problems)
    recorder.assert_clean("the copy buttons")


# ----------------------------------------------------------------------------------------------
# Page length and tables at desktop width (issue 45)
# ----------------------------------------------------------------------------------------------

# At 1280 px: a teaching page (examples/) at most this tall, the Benchmarks page (every device's runs) at most that.
TEACHING_PAGE_MAX_PX, BENCHMARKS_PAGE_MAX_PX = 12_000, 16_000
# Teaching pages still taller than TEACHING_PAGE_MAX_PX while they are being shortened: each must come off this list
# once it fits (the test says so), and the list is then empty.
TALLER_FOR_NOW = set()
# The page's height, and the visible tables wider than the text column they sit in (their first header cells).
PAGE_SIZE_JS = """() => ({
  height: document.documentElement.scrollHeight,
  wide: [...document.querySelectorAll('.md-content table')]
    .filter((t) => t.checkVisibility() && t.scrollWidth > t.closest('.md-typeset').clientWidth + 2)
    .map((t) => [...t.querySelectorAll('th')].slice(0, 3).map((th) => th.textContent.trim()).join(' | ')),
})"""


def _page_size(page, url):
    page.goto(url)
    page.evaluate(CHECK_IMAGES_JS, IMAGE_TIMEOUT_MS)  # figures at their laid-out size
    return page.evaluate(PAGE_SIZE_JS)


def test_the_benchmarks_page_fits_a_desktop(walk, new_context):
    """At 1280 px the Benchmarks page is at most 16,000 px tall, and no table in view is cut off at its column."""
    url = _benchmark_page(walk)
    context, recorder = new_context()
    size = _page_size(context.new_page(), url)
    assert size["height"] <= BENCHMARKS_PAGE_MAX_PX, f"{walk.rel(url)} is {size['height']:,} px tall at 1280 px"
    assert size["wide"] == [], f"tables wider than the text column of {walk.rel(url)}: {size['wide']}"
    recorder.assert_clean("the Benchmarks page's size")


def test_teaching_pages_are_at_most_12000_px_tall(walk, new_context):
    context, recorder = new_context()
    page = context.new_page()
    heights = {walk.rel(url): _page_size(page, url)["height"] for url in walk.pages if walk.rel(url).startswith("examples/")}
    assert heights, "no page under examples/ was walked"
    too_tall = {rel: height for rel, height in heights.items() if height > TEACHING_PAGE_MAX_PX and rel not in TALLER_FOR_NOW}
    assert too_tall == {}, f"teaching pages taller than {TEACHING_PAGE_MAX_PX:,} px at 1280 px: {too_tall}"
    fit_now = sorted(rel for rel in TALLER_FOR_NOW if heights.get(rel, 0) <= TEACHING_PAGE_MAX_PX)
    assert fit_now == [], f"take these pages off TALLER_FOR_NOW, they fit now: {fit_now}"
    recorder.assert_clean("the teaching pages' heights")


def test_the_kv_calculator_computes_what_kv_cache_bytes_does(walk, new_context):
    """For every published model the calculator lists, its JavaScript's bytes (exact, in `data-bytes`) equal
    `attention.models.published.kv_cache_bytes` at a short, a window-crossing and a long context, three batches and
    three element types; a context or batch that is not a count from 1 is refused in words, with no figure."""
    import torch

    from attention.models.published import kv_cache_bytes, published_entries

    url = walk.nav_page(lambda entry: "calculator" in entry.title.lower())
    assert url, "no page with 'calculator' in its navigation title"
    context, recorder = new_context()
    page = context.new_page()
    page.goto(url)
    names = list(published_entries())
    assert page.locator("#kv-model option").all_inner_texts() == names
    cases = [(4096, 1, "bfloat16"), (131073, 3, "float32"), (1048576, 2, "float8_e4m3fn")]
    problems = []
    for index, name in enumerate(names):
        page.select_option("#kv-model", str(index))
        for positions, batch, dtype in cases:
            page.fill("#kv-context", str(positions))
            page.fill("#kv-batch", str(batch))
            page.select_option("#kv-dtype", dtype)
            shown = page.get_attribute("#kv-result", "data-bytes")
            expected = kv_cache_bytes(name, positions, batch, getattr(torch, dtype))
            if shown != str(expected):
                problems.append(f"{name}, {positions:,} positions, batch {batch}, {dtype}: page {shown}, Python {expected}")
    assert problems == [], "the calculator disagrees with kv_cache_bytes:\n" + _listing(problems)
    assert page.locator("#kv-chart circle").count() == 1 and page.locator("#kv-lines li").count() >= 1
    for value, message in (("0", "context must be from 1 to 16,777,216, got 0"),
                           ("12k", "context must be a whole number")):
        page.fill("#kv-context", value)
        assert message in page.inner_text("#kv-result") and page.get_attribute("#kv-result", "data-bytes") == ""
    recorder.assert_clean("the KV-cache calculator")


# ----------------------------------------------------------------------------------------------
# Screenshots for people to look at
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def screenshot_dir(tmp_path_factory):
    folder = os.environ.get("SCREENSHOT_DIR")
    path = pathlib.Path(folder) if folder else tmp_path_factory.getbasetemp() / "screenshots"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _implementation_page(walk):
    """The first page of the "Implementations" nav section; else the first page about einsum."""
    return walk.nav_page(lambda entry: any("implementation" in s.lower() for s in entry.sections)) or next(
        (url for url in walk.pages if "einsum" in walk.rel(url)), None)


def test_screenshots(walk, new_context, screenshot_dir):
    """Full-page screenshots of the home, one implementation and the benchmark page, desktop and phone."""
    benchmark = walk.nav_page(lambda entry: "benchmark" in entry.title.lower())
    targets = {"home": walk.base_url, "implementation": _implementation_page(walk), "benchmarks": benchmark}
    written, recorders = [], []
    for device_name, device in (("desktop", DESKTOP), ("phone", PHONE)):
        context, recorder = new_context(device)
        recorders.append(recorder)
        page = context.new_page()
        for name, url in targets.items():
            if url is None:
                continue
            page.goto(url)
            page.evaluate(CHECK_IMAGES_JS, IMAGE_TIMEOUT_MS)  # lazy images in view and loaded
            path = screenshot_dir / f"{name}-{device_name}.png"
            page.screenshot(path=path, full_page=True)
            written.append(f"  {path}  ({walk.rel(url) or '(home)'})")
    print("\nscreenshots:\n" + "\n".join(written))
    assert benchmark is not None, "no page with 'Benchmark' in its navigation title, so no screenshot of it"
    for recorder in recorders:
        recorder.assert_clean("the screenshots")
