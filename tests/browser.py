"""Headless Chromium for the tests that open pages in a real browser (the HTML view, the
documentation site): Debian's chromium + chromium-driver driven by Selenium.

Without chromium and chromedriver on PATH (``make setup`` installs them where it can) a test
that asks for :func:`browser` skips with the reason, except under ``CI=true``, where a missing
browser is an error (.ci/run installs it); ``ATTNGEOM_NO_BROWSER=1`` (or true, yes) skips anyway.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

CHROMIUM, DRIVER = ("chromium", "chromium-browser"), ("chromedriver",)
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--window-size=1400,2400")             # tall: every element in view
INSTALL = "install them with `make setup` as root, or `apt-get install chromium chromium-driver`"


def _flag(name: str) -> bool:
    """Whether environment variable ``name`` is set to 1, true or yes (any case)."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def browser_paths() -> tuple[str, str]:
    """(chromium, chromedriver) found on PATH; skips the test without them (fails under CI=true)
    and when ATTNGEOM_NO_BROWSER is 1, true or yes."""
    if _flag("ATTNGEOM_NO_BROWSER"):
        pytest.skip("ATTNGEOM_NO_BROWSER is set")
    found = [next(filter(None, map(shutil.which, names)), None) for names in (CHROMIUM, DRIVER)]
    missing = [names[0] for names, path in zip((CHROMIUM, DRIVER), found) if path is None]
    if missing:
        why = f"no headless browser: {' and '.join(missing)} not found on PATH; {INSTALL}"
        if _flag("CI"):
            pytest.fail(f"{why} (CI=true: a missing browser is an error)")
        pytest.skip(why)
    return found[0], found[1]


@pytest.fixture(scope="module")
def browser():
    chromium, chromedriver = browser_paths()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="attngeom-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in FLAGS + (f"--user-data-dir={profile}",):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(chromedriver), options=opts)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)
