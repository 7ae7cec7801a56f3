"""Headless Chromium for tests (Debian's /usr/bin/chromium driven by playwright)."""

from __future__ import annotations

import os
import shutil

import pytest

CHROMIUM = os.environ.get("GPUSCOPE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = os.path.join(os.path.dirname(__file__), "..", "build", "screenshots")


def launch():
    """A playwright Browser; skips the test when no Chromium is installed (CI installs it)."""
    if not os.path.exists(CHROMIUM):
        if os.environ.get("GPUSCOPE_REQUIRE_BROWSER"):  # CI: a missing browser is a failure
            pytest.fail(f"no Chromium at {CHROMIUM}")
        pytest.skip("no Chromium at /usr/bin/chromium (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
    return pw, browser


class Page:
    """A page that records console errors and uncaught exceptions."""

    def __init__(self, browser, width=1280, height=1600):
        self.page = browser.new_page(viewport={"width": width, "height": height})
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

        def on_dialog(d):
            self.dialogs.append(d.message)
            d.dismiss()

        self.page.on("dialog", on_dialog)

    def screenshot(self, name: str) -> str:
        os.makedirs(ARTIFACTS, exist_ok=True)
        path = os.path.join(ARTIFACTS, name)
        self.page.screenshot(path=path, full_page=True)
        return path
