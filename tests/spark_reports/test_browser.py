"""The report in a real browser: Debian's chromium driven headless by Playwright (``.ci/run`` installs both).

The page must render without console errors, every chart must draw data (polylines with points, never
"no data"), and a screenshot is kept in the test's temporary directory (its path is printed).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

import spark_reports
from corda_trio import records as rf

pytestmark = pytest.mark.spark

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip


def _run(d: Path, run_id: str, scenario: str, t0: int, seed: int, links: int) -> None:
    rng = random.Random(seed)
    writer = rf.RecordWriter(d, run_id)
    for i in range(3000):
        due = t0 + i * 2_000_000  # 500/s for 6 s
        delay = int(rng.paretovariate(1.6) * 200_000)
        error = "TimeoutError: no disposition" if i % 97 == 5 else None
        writer.add_sync(
            rf.make_record(
                run_id=run_id,
                scenario=scenario,
                link=f"O=Bank{i % links}->O=Notary",
                size_bytes=1024,
                seq=i,
                intended_ns=due,
                stages={"created": due + 1000, "delivered": due + delay},
                error=error,
            )
        )
    writer.finish({"run_id": run_id, "scenario": scenario, "schema_version": rf.SCHEMA_VERSION})


#: Runs in the report: six like runs, the width at which the comparison table used to overflow the page.
RUNS = 6


def test_report_renders_in_chromium_with_data_in_every_chart(spark: Any, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    d = tmp_path / "in"
    runs = [f"run-{i}" for i in range(1, RUNS + 1)]
    for i, run_id in enumerate(runs):
        _run(d, run_id, "p2p", 1_800_000_000_000_000_000 + i * 100_000_000_000, i + 1, 3)
    html = tmp_path / "report.html"
    result = spark_reports.build_report([d], html, spark=spark)
    assert result.compared == tuple(runs)

    problems: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: m.type == "error" and problems.append(f"console: {m.text}"))
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
            page.goto(html.as_uri(), wait_until="load")
            charts = page.locator("svg.chart")
            n = charts.count()
            assert n == 3 * RUNS + 1  # per run: latency CDF, throughput, errors; plus the comparison
            for i in range(n):
                chart = charts.nth(i)
                title = chart.locator(".chart-title").text_content() or ""
                assert "no data" not in (chart.text_content() or ""), title
                points = chart.locator("polyline").evaluate_all("els => els.map(e => e.points.numberOfItems)")
                assert points and min(points) >= 2, (title, points)
                box = chart.bounding_box()
                assert box is not None and box["width"] > 200 and box["height"] > 150, title
            # the comparison grows down (one row per run), and any table wider than the page scrolls in
            # its own box: the page itself never scrolls sideways, at desktop or at phone width
            rows = page.locator("#comparison ~ div.scroll").first.locator("tr").count()
            assert rows == 1 + 3 * RUNS  # header + one row per run for each of the 3 links
            for width in (1280, 600):
                page.set_viewport_size({"width": width, "height": 900})
                overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
                assert overflow <= 0, (width, overflow)
                boxes = page.locator("div.scroll").evaluate_all(
                    "els => els.map(e => e.getBoundingClientRect().right)"
                )
                assert boxes and max(boxes) <= width, (width, boxes)
            page.set_viewport_size({"width": 1280, "height": 900})
            screenshot = tmp_path / "report.png"
            page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    assert problems == []
    assert screenshot.stat().st_size > 10_000
    print(f"screenshot: {screenshot}")
