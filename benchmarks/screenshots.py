"""Take the README's screenshots: the explorer's default page, and an LLM plan on 64 GPUs
(LLaMA-2 7B on 8 DGX A100 nodes, Megatron tp 8 x pp 2, its first layer block expanded).

    python benchmarks/screenshots.py [--out docs] [--chromium /usr/bin/chromium]

Starts the app on a free local port (as the browser tests do), drives it in headless
Chromium through Playwright and writes docs/screenshot.png and docs/llm-64-gpus.png.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path


def _serve() -> tuple[str, object]:
    from bench_app import _serve as serve  # (this folder: a free local port, threaded)

    from app import create_app
    from app.warmup import warm_up

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    app = create_app(data_dir=tempfile.mkdtemp(prefix="soapbox-shots-"))
    warm_up()
    return serve(app)


def _pick(page, dropdown: str, option: str) -> None:
    page.click(f"#{dropdown}")
    page.locator("input.dash-dropdown-search:visible").fill(option)
    page.get_by_role("option", name=option, exact=True).first.click()
    page.keyboard.press("Escape")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--only", choices=["default", "llm"], default=None)
    args = ap.parse_args(argv)
    from playwright.sync_api import expect, sync_playwright

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    url, server = _serve()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1440, "height": 1800})
            page.set_default_timeout(120_000)
            if args.only in (None, "default"):
                page.goto(url)
                expect(page.locator("#sum-time")).not_to_have_text("–")
                page.wait_for_timeout(1500)
                page.screenshot(path=str(out / "screenshot.png"), full_page=False)
                print(out / "screenshot.png")
            if args.only in (None, "llm"):
                page.goto(url)
                expect(page.locator("#sum-time")).not_to_have_text("–")
                _pick(page, "pick-cluster", "dgx-a100-80gb:8")
                expect(page.locator("#message")).to_contain_text("dgx-a100-80gb:8")
                _pick(page, "pick-model", "llama2-7b")
                expect(page.locator("#message")).to_contain_text("llama2-7b")
                page.fill("#layout-tp", "8")
                page.fill("#layout-pp", "2")
                page.fill("#layout-micro-batch", "1")
                page.click("#layout-apply")
                expect(page.locator("#message")).to_contain_text("Layout (megatron): tp 8, pp 2")
                expect(page.locator("#sum-throughput")).to_contain_text("tokens/s")
                page.wait_for_timeout(1000)
                # expand the first run of layers: click its row in the block stack
                box = page.locator("#op-graph .textpoint text", has_text="layers.0–15").first.bounding_box()
                page.mouse.click(box["x"] - 12, box["y"] + box["height"] / 2)  # its square, left of the text
                expect(page.locator("#message")).to_contain_text("Selected layers.0–15")
                page.wait_for_timeout(2500)
                page.screenshot(path=str(out / "llm-64-gpus.png"), full_page=False)
                print(out / "llm-64-gpus.png")
            browser.close()
    finally:
        server.shutdown()


if __name__ == "__main__":
    main()
