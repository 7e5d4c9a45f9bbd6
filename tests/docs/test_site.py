"""The built documentation site (``make docs``), opened in headless Chromium from disk.

Every page is loaded as a user would open it (file://, no server, no network): no internal link
is broken (its page exists and its #anchor names an element there), every image has loaded, the
search page finds "contribution", and every tutorial ran with no error cell and drew figures.

Without a built site (``docs/_build/html``) these tests skip with the reason, except under
``CI=true``, where .ci/run builds the site first and a missing one is an error. Without a browser
they skip or fail as the HTML view's browser tests do (tests/browser.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlparse

import pytest

from browser import browser  # noqa: F401  (a fixture)

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "docs" / "_build" / "html"
EXECUTED = ROOT / "docs" / "_build" / "jupyter_execute"
TUTORIALS = ("measure-in-notebook", "plain-xarray", "faithfulness", "compare-models",
             "share-a-store")


@pytest.fixture(scope="module")
def site() -> Path:
    if not (SITE / "index.html").is_file():
        why = f"no built site at {SITE.relative_to(ROOT)}: run `make docs`"
        if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
            pytest.fail(f"{why} (CI=true: .ci/run builds it before the tests)")
        pytest.skip(why)
    return SITE


def _pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("*.html")
                  if not p.relative_to(site).parts[0].startswith("_"))


@pytest.fixture(scope="module")
def crawl(site, browser):
    """Per page: its links (absolute file:// URLs), its element ids, its images' load state."""
    found = {}
    for path in _pages(site):
        browser.get(path.as_uri())
        found[path] = browser.execute_script("""
            return {
              links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
              ids: Array.from(document.querySelectorAll('[id]')).map(e => e.id),
              images: Array.from(document.images).map(i => ({src: i.currentSrc || i.src,
                       ok: i.complete && i.naturalWidth > 0}))};""")
    return found


def test_every_page_of_the_sources_was_built(site):
    built = {p.relative_to(site).with_suffix("").as_posix() for p in _pages(site)}
    sources = {p.relative_to(ROOT / "docs").with_suffix("").as_posix()
               for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts}
    assert sources <= built, sources - built


def test_no_internal_link_is_broken(crawl):
    ids = {path: set(page["ids"]) for path, page in crawl.items()}
    broken, checked = [], 0
    for path, page in crawl.items():
        for href in page["links"]:
            url = urlparse(href)
            if url.scheme != "file":
                continue                                  # the site links nowhere else offline
            target, anchor = urldefrag(href)
            file = Path(unquote(urlparse(target).path))
            checked += 1
            if file.is_dir():
                file = file / "index.html"
            if not file.is_file():
                broken.append((path.name, href))
            elif anchor and file.suffix == ".html" and file in ids and anchor not in ids[file]:
                broken.append((path.name, href))
    assert checked > 200
    assert not broken, broken[:20]


def test_no_link_leaves_the_site_for_the_network(crawl):
    """Offline: every link is a file of the site (or a mailto:), none needs the network."""
    remote = sorted({href for page in crawl.values() for href in page["links"]
                     if urlparse(href).scheme in ("http", "https")})
    assert not remote, remote[:10]


def test_every_figure_loads(crawl):
    images = [(p.name, img) for p, page in crawl.items() for img in page["images"]]
    assert len(images) >= 10
    assert all(img["ok"] for _, img in images), [x for x in images if not x[1]["ok"]]
    drawn = [f"tutorials/{name}" for name in TUTORIALS if name != "share-a-store"]
    for name in drawn + ["getting-started", "concepts"]:
        assert crawl[SITE / f"{name}.html"]["images"], f"{name} shows no figure"


def test_search_finds_contribution(site, browser):
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get((site / "search.html").as_uri() + "?q=contribution")
    WebDriverWait(browser, 120, 0.2).until(lambda d: d.execute_script(  # results come one by one
        "const s = document.querySelector('#search-results .search-summary');"
        "return s !== null && /found/i.test(s.textContent)"))
    hits = browser.execute_script(
        "return Array.from(document.querySelectorAll('#search-results li a'))"
        ".map(a => a.href)")
    assert any("concepts" in h for h in hits), hits[:10]
    assert len(hits) >= 5


@pytest.mark.parametrize("name", TUTORIALS)
def test_tutorial_ran_without_error_and_drew_figures(site, name):
    """The executed notebook myst-nb kept: no error output, every code cell ran, and at least
    one figure (a PNG output) for the tutorials that plot."""
    notebook = json.loads((EXECUTED / "tutorials" / f"{name}.ipynb").read_text())
    cells = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    assert cells and all(c.get("execution_count") for c in cells), name
    outputs = [o for c in cells for o in c.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"], name
    pngs = [o for o in outputs if "image/png" in o.get("data", {})]
    assert pngs or name == "share-a-store", f"{name} drew no figure"
