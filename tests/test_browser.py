"""The rendered book, both editions, in a real browser: headless Chromium, no network, every equation and chart drawn.

Runs after the book is built into _build/html (`make test` builds it first). Each chapter page is served
from 127.0.0.1; the browser reaches no other host, and any request for anything else counts as a failure, which
is how the test proves the book renders offline. A screenshot of the top of each page is saved under
_build/screenshots/.
"""

import functools
import http.server
import json
import os
import shutil
import threading
from pathlib import Path
from urllib.parse import quote

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"
# The English edition at the root, the Chinese one in zh_CN/ (see book/_ext/book_sphinx.py).
EDITIONS = ["", "zh_CN/"]
CHAPTERS = [c["file"] for part in yaml.safe_load((ROOT / "_toc.yml").read_text())["parts"] for c in part["chapters"]]
# Sphinx 7 (which jupyter-book<2 requires) registers an inline script added after the builder starts twice,
# once as _JavaScript(None, body) and once as _JavaScript('', body), which its de-duplication sees as different.
# sphinx-thebe's configuration snippet is such a script, so every Jupyter Book 1 page declares its constants
# twice; the first declaration stands and nothing else breaks. Any other JavaScript error fails the test.
KNOWN_UPSTREAM_ERRORS = ("Identifier 'THEBE_JS_URL' has already been declared",)
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",  # every other host, IP addresses too, fails
]


def unavailable(reason: str):
    "Skip with a visible reason on a user's machine; under CI the browser check must run."
    if os.environ.get("CI") == "true":
        pytest.fail(reason + " (CI=true: the browser check is required)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def server():
    if not (HTML / "index.html").is_file():
        unavailable("the book is not built: run `make test` or `make book` first")
    handler = functools.partial(_QuietHandler, directory=str(HTML))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def context():
    """One browser context for every page, as one reader's browser: its cache keeps what all pages load (MathJax,
    Vega, the theme), rather than reading and compiling it again for each page. The pages watch their requests
    instead of routing them: Playwright's routing would turn that cache off."""
    executable = os.environ.get("AT_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not executable:
        unavailable("Chromium not found: install it (Debian: apt-get install chromium) or set AT_CHROMIUM")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("playwright is not installed (pip install -r requirements.txt)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_FLAGS)
        yield browser.new_context(viewport={"width": 1280, "height": 900})
        browser.close()


def charts_in_notebook(chapter: str) -> int:
    "How many charts the chapter's stored outputs hold (none on a Markdown page)."
    path = ROOT / f"{chapter}.ipynb"
    if not path.is_file():
        return 0
    nb = json.loads(path.read_text(encoding="utf-8"))
    return sum(
        'class="at-chart"' in "".join(o.get("data", {}).get("text/html", ""))
        for c in nb["cells"]
        for o in c.get("outputs", [])
    )


@pytest.mark.parametrize("edition", EDITIONS, ids=lambda e: e.strip("/") or "en")
@pytest.mark.parametrize("chapter", ["book/index", *CHAPTERS])  # the landing page too: it shows Figure 1
def test_chapter_renders_offline(server, context, chapter, edition):
    page = context.new_page()
    problems = []
    page.on(  # data: and blob: URLs are the page's own; anything else must come from the local server
        "request",
        lambda r: r.url.startswith((server, "data:", "blob:")) or problems.append(f"request to the network: {r.url}"),
    )
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url} ({r.failure})"))
    page.on("response", lambda r: r.status >= 400 and problems.append(f"HTTP {r.status}: {r.url}"))
    page.on("pageerror", lambda e: str(e) in KNOWN_UPSTREAM_ERRORS or problems.append(f"JavaScript error: {e}"))

    page.goto(server + edition + chapter + ".html", wait_until="load")

    # MathJax: every math element of the page has been typeset.
    math = page.locator(".math").count()
    if math:
        page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=30_000)
        page.evaluate("() => MathJax.startup.promise")
        untypeset = page.evaluate(
            "() => [...document.querySelectorAll('.math')].filter(m => !m.querySelector('mjx-container')).length"
        )
        assert untypeset == 0, f"{untypeset} of {math} equations were not typeset by MathJax"

    # Altair: every chart stored in the notebook is on the page and drew itself.
    expected = charts_in_notebook(chapter)
    assert page.locator(".at-chart").count() == expected
    if expected:
        page.wait_for_function(
            "() => [...document.querySelectorAll('.at-chart')].every(c => c.matches('.vega-embed') && c.querySelector('svg, canvas'))",
            timeout=30_000,
        )
        assert not [t for t in page.locator(".at-chart").all_inner_texts() if "Chart error" in t]

    (SHOTS / edition).mkdir(parents=True, exist_ok=True)
    # What a reader sees first: a full-page picture of a long chapter costs more than the rest of the check.
    page.screenshot(path=str(SHOTS / edition / f"{Path(chapter).name}.png"))
    page.close()
    assert not problems, "\n".join(problems)


def test_the_editions_link_to_each_other(server, context):
    "From a chapter to its Chinese page and back, by the links a reader clicks; each lands on the same chapter."
    page = context.new_page()
    page.goto(server + "book/04_encoding.html", wait_until="load")
    page.click("a.edition-link[hreflang=zh-CN]")
    page.wait_for_url(server + "zh_CN/book/04_encoding.html")
    assert (
        page.locator("html").get_attribute("lang") == "zh-CN" and "位置编码" in page.locator("article h1").inner_text()
    )
    page.click("a.edition-link[hreflang=en]")
    page.wait_for_url(server + "book/04_encoding.html")
    assert page.locator("html").get_attribute("lang") == "en"
    page.close()


def test_chinese_search_finds_chinese_words(server, context):
    "The Chinese edition's search (Sphinx's zh search, its index split into words by jieba) finds a Chinese term."
    page = context.new_page()
    page.goto(server + "zh_CN/search.html?q=" + quote("位置编码"), wait_until="load")
    page.wait_for_function("() => document.querySelectorAll('#search-results li').length > 0", timeout=30_000)
    found = page.locator("#search-results li a").evaluate_all("links => links.map(a => a.getAttribute('href'))")
    page.close()
    assert any("04_encoding" in href for href in found), found


def test_attention_chapter_has_math_and_a_chart():
    "The chapter the backbone was built around must keep exercising both (the test above checks they render)."
    html = (HTML / "book" / "01_attention.html").read_text(encoding="utf-8") if HTML.exists() else ""
    if not html:
        unavailable("the book is not built")
    assert 'class="math' in html and 'class="at-chart"' in html


def test_visualisation_menus_change_the_charts(server, context):
    """On the chapter on the heads (Seeing the heads), every layer and head menu (and the statistics menu) redraws its chart offline.

    Saves a screenshot of the encoder-decoder attention chart once its menus have been changed."""
    page = context.new_page()
    page.goto(server + "book/11_attention_heads.html", wait_until="load")
    page.wait_for_function(
        "() => [...document.querySelectorAll('.at-chart')].every(c => c.querySelector('svg'))", timeout=30_000
    )
    charts = [c for c in page.locator(".at-chart").all() if c.locator(".vega-bindings select").count()]
    assert len(charts) == 4, "the three kinds of attention and the head statistics have menus"
    changed = 0
    for chart in charts:
        svg = chart.locator("svg").first.element_handle()
        for menu in chart.locator(".vega-bindings select").all():
            options = menu.locator("option").all_inner_texts()
            assert len(options) >= 2
            before = svg.inner_html()
            menu.select_option(label=options[-1] if menu.input_value() != options[-1] else options[0])
            page.wait_for_function("([svg, before]) => svg.innerHTML !== before", arg=[svg, before], timeout=10_000)
            changed += 1
    cross = [c for c in charts if "Encoder-decoder attention: layer" in c.inner_text()]
    assert len(cross) == 1
    page.evaluate("() => document.activeElement && document.activeElement.blur()")
    SHOTS.mkdir(parents=True, exist_ok=True)
    cross[0].screenshot(path=str(SHOTS / "11_attention_heads-cross-attention.png"))
    page.close()
    assert changed >= 7  # 3 kinds x (layer, head), and the statistics menu
