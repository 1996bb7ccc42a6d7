"""Issue 28, item 6: the Learn tab's page on parallel random initialisation, in a real headless
Chromium (Playwright): its heading, the three arms and the measured conclusion (whichever way
it came out: here, that one run needs less compute) are shown, with no console error. No
wall-clock assertion."""

from __future__ import annotations

import pytest
from conftest import BROWSER_TIMEOUT_MS as TIMEOUT_MS
from playwright.sync_api import Page, expect

from app.learn import TOPICS


@pytest.mark.browser
def test_learn_page_shows_the_init_sweep_measurement(page: Page, app_url: str):
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(app_url)
    expect(page.locator("#sum-time")).to_contain_text("ms")
    page.locator("#tabs").get_by_text("Learn", exact=True).click()
    title = TOPICS["init-sweep"][0]
    heading = page.get_by_role("heading", name=title)
    expect(heading).to_be_visible()
    panel = page.locator(".panel", has=heading)
    for words in ("16 independent runs", "one run", "soapbox init-sweep",
                  "it does not save compute", "python benchmarks/init_sweep.py"):
        expect(panel).to_contain_text(words)
    expect(panel.locator("li")).to_have_count(3)  # the three arms, as a list
    assert not errors, errors
