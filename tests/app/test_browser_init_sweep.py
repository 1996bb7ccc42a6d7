"""Issue 28, item 6: the Learn tab's page on parallel random initialisation, in a real headless
Chromium (Playwright): its heading, the three arms and the measured conclusion (whichever way
it came out: here, that one run needs less compute) are shown, and the figure of the committed
measurement is drawn (its SVG: a panel per problem, the three arms' lines and bands, the legend),
with no console error. No wall-clock assertion."""

from __future__ import annotations

import re

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
    graph = panel.locator("#learn-init-sweep-graph")
    graph.scroll_into_view_if_needed()
    expect(graph.locator("svg.main-svg").first).to_be_visible()
    # 2 panels x 3 arms x (band top, band bottom, median): the ablation is in the legend only
    expect(graph.locator(".scatterlayer .trace")).to_have_count(18)
    expect(graph.locator(".scatterlayer .trace path.js-line").first).to_have_attribute("d", re.compile(r"^M.+L"))
    for name in ("init-sweep", "16 independent runs", "one run", "init-sweep, no narrowing"):
        expect(graph.locator(".legend .legendtext", has_text=re.compile(f"^{re.escape(name)}$"))).to_have_count(1)
    expect(graph.locator(".gtitle")).to_contain_text("median over 7 seeds")
    assert not errors, errors
