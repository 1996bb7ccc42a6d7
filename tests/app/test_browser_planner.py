"""Issue 44, the LLM engineer's flow in a real headless Chromium: a search asked for a plan
Megatron-LM can run (exportable, tp fixed), its best adopted, and its Megatron-LM flags
downloaded from the Export tab."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from test_browser import open_app, pick, settled

pytestmark = pytest.mark.browser


def test_search_exportable_to_megatron_adopt_and_export(page: Page, app_url: str):
    open_app(page, app_url)
    pick(page, "pick-cluster", "dgx-a100-80gb:1")
    expect(page.locator("#message")).to_contain_text("Cluster: dgx-a100-80gb:1")
    settled(page)
    pick(page, "pick-model", "gpt2")
    expect(page.locator("#message")).to_contain_text("Model: gpt2")
    settled(page)
    page.locator("#tabs").get_by_text("Search", exact=True).click()
    page.locator("#search-constraints summary").click()
    page.click("#search-exportable")
    page.get_by_role("option", name="megatron", exact=True).click()
    page.fill("#search-tp", "2")
    page.fill("#search-budget", "60")  # layouts priced: all of them, well within it
    page.click("#search-start")
    expect(page.locator("#search-status")).to_contain_text("auto finished", timeout=300_000)
    expect(page.locator("#search-status")).to_contain_text("the layout search ran")
    page.click("#search-adopt")
    expect(page.locator("#message")).to_contain_text("Adopted")
    settled(page)
    page.locator("#tabs").get_by_text("Export", exact=True).click()
    with page.expect_download() as dl:
        page.click("#export-megatron")
    text = open(dl.value.path()).read()
    assert "--tensor-model-parallel-size 2" in text
