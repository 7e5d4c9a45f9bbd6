"""attngeom view in a real browser: headless Chromium (Debian's chromium + chromium-driver)
driven by Selenium, the page loaded offline from file://.

The test changes the selectors, clicks tokens and map cells, hovers, reads the numbers the
page shows and compares them with the shards read by plain xarray (tests/view_reference.py),
and checks that a screenshot is not blank. Without chromium and chromedriver on PATH (``make
setup`` installs them where it can) these tests skip with the reason, except under ``CI=true``,
where a missing browser is an error (.ci/run installs it); ``ATTNGEOM_NO_BROWSER=1`` (or true,
yes) skips them anyway.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

import view_reference as R
from browser import browser, browser_paths  # noqa: F401  (browser: a fixture)
from attngeom.reports.view import view


class Page:
    """One view in the browser: selectors, clicks, hovers, and the numbers shown."""

    def __init__(self, driver, root_index: int = 0):
        self.d = driver
        self.root = driver.find_elements("css selector", ".ag-view")[root_index]

    def wait(self) -> None:
        from selenium.webdriver.support.ui import WebDriverWait

        WebDriverWait(self.d, 20, 0.05).until(
            lambda d: self.root.get_attribute("data-state") in ("ready", "error"))
        assert self.root.get_attribute("data-state") == "ready", self.root.text[:300]

    def choose(self, role: str, value) -> None:
        from selenium.webdriver.support.ui import Select

        Select(self.root.find_element("css selector", f"select[data-role={role}]")
               ).select_by_value(str(value))
        self.wait()

    def el(self, css: str):
        return self.root.find_element("css selector", css)

    def click(self, css: str) -> None:
        self.el(css).click()
        self.wait()

    def hover(self, css: str) -> dict[str, str]:
        """Move the mouse onto an element; the tooltip's numbers by metric."""
        from selenium.webdriver.common.action_chains import ActionChains

        ActionChains(self.d).move_to_element(self.el(css)).perform()
        return self.tip()

    def tip(self) -> dict[str, str]:
        """The numbers the tooltip shows now, by metric (its visible text, one line each)."""
        lines = self.d.execute_script(
            "var t = arguments[0].querySelector('.ag-tip');"
            "if (!t || getComputedStyle(t).display === 'none') return null;"
            "return Array.from(t.querySelectorAll('.ag-tip-line'))"
            ".map(function (e) { return [e.getAttribute('data-metric'), e.innerText]; });",
            self.root)
        assert lines is not None, "no tooltip shown"
        return {metric: text.rsplit(" = ", 1)[1] for metric, text in lines}

    def query(self) -> int:
        return int(self.root.get_attribute("data-query"))


def load(driver, page, tmp_path, name: str = "view.html") -> Page:
    path = page.save(tmp_path / name)
    driver.get(path.as_uri())
    p = Page(driver)
    p.wait()
    return p


def assert_shown(shown: dict[str, str], want: dict, where: str) -> None:
    for metric, value in want.items():
        if metric in shown:
            assert R.shown_close(shown[metric], value), (where, metric, shown[metric], value)
    assert set(want) <= set(shown), (where, set(want) - set(shown))


def not_blank(png: bytes) -> None:
    from PIL import Image

    img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    colours = np.unique(img.reshape(-1, 3), axis=0)
    ink = (img < 200).any(-1).mean()
    assert len(colours) > 50 and ink > 0.02, (len(colours), ink)


def test_compact_view_shows_the_store_numbers(browser, compact_view_data, tmp_path):
    _, ds, raw = compact_view_data
    p = load(browser, view(ds), tmp_path)
    s, l, h = 2, 1, 3
    n = int(raw["length"].values[s])
    p.choose("sequence", s)
    p.choose("layer", l)
    p.choose("head", h)
    i = n - 3
    p.click(f".ag-cell[data-pos='{i}']")                       # clicking a token: the query
    assert p.query() == i
    for j in (0, 1, i, i - 2, i - 3, 3):                       # sink, sink, tail, tail, middle
        assert_shown(p.hover(f".ag-cell[data-pos='{j}']"), R.key_values(raw, s, l, h, i, j),
                     f"key {j}")
    shown = p.hover(".ag-cell[data-cell='middle']")
    d4 = R.PAIR_DIMS
    assert_shown(shown, {"alpha": R.arr(raw, "middle_alpha", d4)[s, l, h, i],
                         "middle_count": R.arr(raw, "middle_count", d4)[s, l, h, i]}, "middle")
    p.choose("head", -1)                                      # the layer total
    for j in (0, i - 1):
        assert_shown(p.hover(f".ag-cell[data-pos='{j}']"), R.layer_values(raw, s, l, i, j),
                     f"layer key {j}")
    p.choose("head", h)
    p.choose("strip-a", "cosine")
    legend = p.el(".ag-legends").text
    assert "cos" in legend and "-1" in legend
    # the map: hover the cell of (layer, head), switch metric and scope, click another cell
    rate = R.sink_map(raw, "sink_rate", 2)
    shown = p.hover(f".ag-map-cell[data-layer='{l}'][data-head='{h}']")
    assert R.shown_close(shown["sink_rate"], rate[s, l, h])
    p.choose("map", "sink_contribution")
    shown = p.hover(f".ag-map-cell[data-layer='0'][data-head='1']")
    assert R.shown_close(shown["sink_contribution"], R.sink_map(raw, "sink_contribution", 2)[s, 0, 1])
    p.choose("scope", "pooled")
    shown = p.hover(f".ag-map-cell[data-layer='0'][data-head='1']")
    pooled = R.sink_map(raw, "sink_contribution", 2, pooled=True)
    assert R.shown_close(shown["sink_contribution"], pooled[0, 1])
    p.click(".ag-map-cell[data-layer='0'][data-head='1']")
    assert p.el("select[data-role=layer]").get_attribute("value") == "0"
    assert p.el("select[data-role=head]").get_attribute("value") == "1"
    not_blank(p.root.screenshot_as_png)


def test_dense_view_heat_map_picks_the_query(browser, dense_view_data, tmp_path):
    _, ds, raw = dense_view_data
    p = load(browser, view(ds, sequences="0:3"), tmp_path)
    s, l, h = 1, 0, 2
    p.choose("sequence", s)
    p.choose("layer", l)
    p.choose("head", h)
    canvas = p.el("canvas.ag-heat")
    n = int(raw["length"].values[s])
    i = 4
    from selenium.webdriver.common.action_chains import ActionChains

    size = canvas.size
    at = (int((2.5 / n - 0.5) * size["width"]), int(((i + 0.5) / n - 0.5) * size["height"]))
    ActionChains(browser).move_to_element_with_offset(canvas, *at).click().perform()
    p.wait()                                                     # row i, column 2
    assert p.query() == i
    ActionChains(browser).move_to_element_with_offset(canvas, at[0] + 2, at[1]).perform()
    assert R.shown_close(p.tip()["alpha"], R.key_values(raw, s, l, h, i, 2)["alpha"])
    for j in (0, 2, i, i + 1):                                   # i + 1: a future key, masked
        assert_shown(p.hover(f".ag-cell[data-pos='{j}']"), R.key_values(raw, s, l, h, i, j),
                     f"key {j}")
    p.choose("heat", "contribution")
    assert "c" in p.el(".ag-heat-panel .ag-legend").text
    not_blank(p.root.screenshot_as_png)


def test_two_inline_views_with_a_learned_sink(browser, compact_view_data, tmp_path):
    """The Jupyter HTML (twice on one page, as two notebook outputs) works view by view; a
    learned sink's weight appears as its own cell."""
    ds = compact_view_data[1].copy()
    rng = np.random.default_rng(0)
    weight = rng.uniform(0, 0.2, tuple(ds.sizes[d] for d in R.PAIR_DIMS))
    ds["learned_sink_alpha"] = (R.PAIR_DIMS, np.where(
        ds["query"].values < ds["length"].values[:, None, None, None], weight, np.nan))
    one = view(ds, sequence=0, sequences="0:2")
    host = ("<!DOCTYPE html><html><head><meta charset='utf-8'></head><body><h1>notebook</h1>"
            f"<div class='output'>{one._repr_html_()}</div>"
            f"<div class='output'>{one._repr_html_()}</div></body></html>")
    path = tmp_path / "host.html"
    path.write_text(host, encoding="utf-8")
    browser.get(path.as_uri())
    first, second = Page(browser, 0), Page(browser, 1)
    first.wait()
    second.wait()
    second.choose("sequence", 1)
    second.choose("layer", 0)
    second.choose("head", 2)
    i = int(ds["length"].values[1]) - 1
    shown = second.hover(".ag-cell[data-cell='learned']")
    assert R.shown_close(shown["alpha"], weight[1, 0, 2, i])
    assert first.el("select[data-role=sequence]").get_attribute("value") == "0"
    second.choose("map", "learned_sink")
    shown = second.hover(".ag-map-cell[data-layer='0'][data-head='2']")
    assert R.shown_close(shown["learned_sink"], weight[1, 0, 2, 2:i + 1].mean())


def _outcome() -> tuple[str, str]:
    """What :func:`browser_paths` does here: ("skip" | "fail", its message) or ("found", "")."""
    try:
        browser_paths()
    except pytest.skip.Exception as exc:
        return "skip", str(exc)
    except pytest.fail.Exception as exc:
        return "fail", str(exc)
    return "found", ""


@pytest.mark.parametrize("no_browser", [None, "0", "no", ""])
def test_missing_browser_skips_and_fails_under_ci(monkeypatch, tmp_path, no_browser):
    """Nothing on PATH: a skip naming what is missing, a failure under CI=true; an
    ATTNGEOM_NO_BROWSER that is not 1/true/yes changes neither."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CI", raising=False)
    if no_browser is None:
        monkeypatch.delenv("ATTNGEOM_NO_BROWSER", raising=False)
    else:
        monkeypatch.setenv("ATTNGEOM_NO_BROWSER", no_browser)
    missing = "chromium and chromedriver not found on PATH"
    kind, message = _outcome()
    assert kind == "skip" and missing in message and "\n" not in message, (kind, message)
    for ci in ("true", "1"):
        monkeypatch.setenv("CI", ci)
        kind, message = _outcome()
        assert kind == "fail" and missing in message, (ci, kind, message)
    monkeypatch.setenv("CI", "false")
    assert _outcome()[0] == "skip"


@pytest.mark.parametrize("value", ["1", "true", "YES"])
def test_no_browser_flag_skips_even_under_ci(monkeypatch, tmp_path, value):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("ATTNGEOM_NO_BROWSER", value)
    assert _outcome() == ("skip", "ATTNGEOM_NO_BROWSER is set")


def test_browser_found_on_path(monkeypatch, tmp_path):
    """Executables named chromium and chromedriver on PATH are the ones used."""
    for name in ("chromium", "chromedriver"):
        exe = tmp_path / name
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("ATTNGEOM_NO_BROWSER", "0")
    monkeypatch.setenv("CI", "true")
    assert _outcome() == ("found", "")
    assert browser_paths() == (str(tmp_path / "chromium"), str(tmp_path / "chromedriver"))


@pytest.fixture(scope="module")
def long_store(tmp_path_factory):
    """One 8,192-token text through a tiny llama (past its 128 positions, on purpose)."""
    import warnings

    import tiny_models as tm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from attngeom import measure
    from attngeom.store import write

    root = tmp_path_factory.mktemp("long")
    model_dir = tm.save_tiny("llama", root / "model")
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    words = tm._WORDS[: tm.VOCAB_SIZE - tm.N_SPECIAL]
    text = " ".join(words[(7 * i) % len(words)] for i in range(8300))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)             # beyond its context
        ds = measure(model, [text], tokenizer=tok, max_length=8192)
    write(ds, root / "store")
    return root / "store"


def test_an_8192_token_view_fits_and_draws_a_window_at_the_query(browser, long_store, tmp_path):
    from attngeom.store.format.vocab import VIEW_MAX_BYTES

    raw = R.plain(long_store)
    n = int(raw["length"].values[0])
    assert n == 8192
    page = view(long_store)
    assert page.nbytes <= VIEW_MAX_BYTES
    p = load(browser, page, tmp_path)
    drawn = lambda: [int(c.get_attribute("data-pos"))                       # noqa: E731
                     for c in p.root.find_elements("css selector", ".ag-cell[data-pos]")]
    i = p.query()
    keys = drawn()
    assert len(keys) <= 256 + 1 and 0 in keys and i in keys       # the sink and a window
    p.choose("layer", 1)
    p.choose("head", 2)
    for j in (0, i - 1, i - 8):                                    # sink, tail, tail
        assert_shown(p.hover(f".ag-cell[data-pos='{j}']"), R.key_values(raw, 0, 1, 2, i, j),
                     f"key {j}")
    gap = p.el(".ag-cell[data-cell='gap']")
    lo, hi = map(int, gap.get_attribute("data-range").split(":"))
    assert (lo, hi) == (1, min(keys[1:]))                           # the keys between
    gap.click()
    p.wait()
    assert p.query() == hi - 1 and hi - 1 in drawn()                # the window moved there
    j = p.query() - 3
    assert_shown(p.hover(f".ag-cell[data-pos='{j}']"), R.key_values(raw, 0, 1, 2, j + 3, j),
                 "after paging")
