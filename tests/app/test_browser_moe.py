"""Issue 26, item 5: the explorer with a mixture-of-experts model at 64 GPUs in a real headless
Chromium (Playwright): the Learn tab's guided step sets up Mixtral 8x7B on eight DGX H100s,
the Experts panel draws tokens and time per expert and per rank with no label over another,
the timeline draws the all-to-alls, the layout panel's ep is checked as typed and refused
with the reason, the what-if buttons re-simulate, a bad histogram is refused and a good one
read — and no console errors. Waits are generous; no wall-clock assertion."""

from __future__ import annotations

import json

import pytest
from conftest import BROWSER_TIMEOUT_MS as TIMEOUT_MS
from playwright.sync_api import Page, expect

#: what the Experts figure prints: tick labels, axis titles, panel titles and the legend
EXPERT_LABELS = ("g.xtick text", "g.x2tick text", "g.ytick text", "g.y2tick text", "text.xtitle", "text.x2title",
                 "text.ytitle", "text.y2title", "g.annotation", "g.legend g.traces")


def settled(page: Page) -> None:
    """Until no callback is in flight (Dash marks what a callback will update)."""
    page.wait_for_function("() => !document.querySelector('[data-dash-is-loading=\"true\"]')", timeout=TIMEOUT_MS)


def boxes(page: Page, figure: str, selectors: tuple[str, ...]) -> list[dict]:
    out = []
    for sel in selectors:
        for el in page.locator(f"{figure} {sel}").all():
            b = el.bounding_box()
            text = (el.text_content() or "").strip()
            if b and b["width"] > 0 and b["height"] > 0 and text:
                out.append({**b, "what": f"{sel}: {text[:40]}"})
    return out


def overlaps(a: dict, b: dict, slack: float = 0.5) -> bool:
    return (a["x"] + a["width"] > b["x"] + slack and b["x"] + b["width"] > a["x"] + slack
            and a["y"] + a["height"] > b["y"] + slack and b["y"] + b["height"] > a["y"] + slack)


def assert_no_overlap(page: Page, figure: str, selectors: tuple[str, ...]) -> int:
    """No two printed labels of the figure overlap (each with each, across kinds); how many."""
    found = boxes(page, figure, selectors)
    clashes = [(a["what"], b["what"]) for i, a in enumerate(found) for b in found[i + 1:] if overlaps(a, b)]
    assert not clashes, clashes
    return len(found)


@pytest.mark.browser
def test_expert_view_at_64_gpus(page: Page, app_url: str, tmp_path):
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(app_url)
    expect(page.locator("#sum-time")).to_contain_text("ms")
    # a dense model: no Experts panel
    expect(page.locator("#expert-panel")).to_be_hidden()

    # the guided step: Mixtral 8x7B on dgx-h100:8 (64 GPUs), ep 8 under a skewed router
    page.locator("#tabs").get_by_text("Learn", exact=True).click()
    expect(page.get_by_role("heading", name="Expert parallelism (mixture of experts)")).to_be_visible()
    page.get_by_role("button", name="3 · Expert parallelism on Mixtral 8x7B at 64 GPUs").click()
    expect(page.locator("#message")).to_contain_text("Guided comparison 3", timeout=3 * TIMEOUT_MS)
    expect(page.locator("#expert-panel")).to_be_visible(timeout=3 * TIMEOUT_MS)
    expect(page.locator("#expert-summary")).to_contain_text("Simulated now: the applied what-if",
                                                            timeout=3 * TIMEOUT_MS)
    expect(page.locator("#expert-panel")).to_contain_text("Published MoE runs are measured with balanced routing")
    expect(page.locator("#expert-summary")).to_contain_text("EP rank 0 (expert 0) receives 37%")
    expect(page.locator("#expert-figure .barlayer .point").first).to_be_visible()
    expect(page.locator("#expert-figure g.legend")).to_contain_text("rank 0's experts (busiest)")
    settled(page)
    assert assert_no_overlap(page, "#expert-figure", EXPERT_LABELS) >= 20

    # the timeline: the all-to-alls in their own colour, named in the legend
    expect(page.locator("#gantt g.legend")).to_contain_text("all-to-all (MoE dispatch/combine)")
    expect(page.locator("#sum-tasks")).to_contain_text("GPUs simulated; the rest mirror them")
    # the block stack names experts, top-k and ep on the layers' row
    expect(page.locator("#op-graph .textpoint text", has_text="MoE 8 experts top-2 · ep 8").first).to_be_visible()

    # back to balanced routing: re-simulated, faster
    skewed = page.inner_text("#sum-time")
    page.click("#expert-balanced")
    expect(page.locator("#message")).to_contain_text("Routing back to balanced")
    expect(page.locator("#sum-time")).not_to_have_text(skewed)
    expect(page.locator("#expert-summary")).to_contain_text("Simulated now: balanced routing")

    # the layout panel: ep checked as it is typed, refused with the engine's reason
    settled(page)
    expect(page.locator("#layout-ep")).to_be_enabled()
    page.fill("#layout-ep", "3")
    page.press("#layout-ep", "Enter")
    expect(page.locator("#layout-moe-hint")).to_contain_text("ep 3 does not divide the 8 experts")
    page.click("#layout-apply")
    expect(page.locator("#message")).to_contain_text("Layout refused: ep 3 does not divide the 8 experts")
    settled(page)
    page.fill("#layout-ep", "4")
    page.fill("#layout-etp", "2")
    page.press("#layout-etp", "Enter")
    expect(page.locator("#layout-moe-hint")).to_contain_text("8 experts over ep 4: 2 per rank, etp 2")
    before = page.inner_text("#sum-time")
    page.click("#layout-apply")
    expect(page.locator("#message")).to_contain_text("ep 4, etp 2")
    expect(page.locator("#sum-time")).not_to_have_text(before)
    expect(page.locator("#expert-summary")).to_contain_text("ep 4 x etp 2")

    # histograms: a bad file is refused (the what-if stays as it was), a good one applies
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2, 3]")
    page.set_input_files("#expert-upload input[type=file]", str(bad))
    expect(page.locator("#expert-hist-note")).to_contain_text("Histogram refused: bad.json lists 3 experts")
    good = tmp_path / "measured.json"
    good.write_text(json.dumps([1, 1, 1, 1, 1, 1, 1, 13]))
    page.set_input_files("#expert-upload input[type=file]", str(good))
    expect(page.locator("#expert-hist-note")).to_contain_text("Histogram measured.json: 8 experts")
    expect(page.locator("#expert-summary")).to_contain_text("EP rank 3 (experts 6–7)")
    settled(page)
    before = page.inner_text("#sum-time")
    page.click("#expert-apply")
    expect(page.locator("#message")).to_contain_text("Routing what-if applied (histogram measured.json)")
    expect(page.locator("#sum-time")).not_to_have_text(before)
    expect(page.locator("#expert-summary")).to_contain_text("Simulated now: the applied what-if")
    settled(page)
    assert_no_overlap(page, "#expert-figure", EXPERT_LABELS)
    page.screenshot(path="/tmp/soapbox-moe-explorer.png", full_page=True)
    page.locator("#expert-panel").screenshot(path="/tmp/soapbox-moe-experts.png")
    assert not errors, errors
