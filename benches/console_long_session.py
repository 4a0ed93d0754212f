"""A 5,000-message session in the web console, in Debian's Chromium through Playwright: how long
until the conversation is painted, and until a scroll to its end shows the last message.

Two contenders in the same run, alternating round by round, on one stack (five services, the
transcript written once to the memory service):

- **windowed**: the console as it is — only the entries in view are in the page (windowed.js);
- **all** (the baseline): the same console with `?render=all`, every entry in the page, as the
  console rendered a transcript before the window.

Each round opens a fresh page at `#/sessions/long` and measures, in the browser (performance.now()
from navigation start): **first paint** — the session's last message is in the page and a frame
has been drawn; **to the end** — from the top of the conversation, one jump to its end until the
last message is drawn. Also the number of message elements in the page.

    python -m benches.console_long_session [--rounds 5] [--messages 5000]

On a shared 2-core VM at load average 10.5 (2026-11-28, 3 rounds, p50): first paint 647 ms
windowed, 1,553 ms with every entry; to the end 49 ms windowed, 33 ms with every entry (already
laid out); 14 message elements in the page against 5,000.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
from pathlib import Path

from playwright.async_api import async_playwright

from tests.support.stack import Stack
from tests.web.browser import CHROMIUM, launch
from tests.web.test_console_long import long_session

PAINTED = """async (seq) => {
    const selector = `.bubble[data-seq="${seq}"]`;
    while (!document.querySelector(selector)) await new Promise((r) => setTimeout(r, 5));
    await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
    return performance.now();
}"""

TO_THE_END = """async (seq) => {
    const log = document.getElementById("log");
    log.scrollTop = 0;
    await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
    const started = performance.now();
    log.scrollTop = log.scrollHeight;
    const selector = `.bubble[data-seq="${seq}"]`;
    for (;;) {
        await new Promise((r) => requestAnimationFrame(r));
        const element = document.querySelector(selector);
        if (element) {
            const box = element.getBoundingClientRect(), view = log.getBoundingClientRect();
            if (box.bottom > view.top && box.top < view.bottom) break;
        }
        log.scrollTop = log.scrollHeight;
    }
    await new Promise((r) => requestAnimationFrame(r));
    return performance.now() - started;
}"""


async def one_round(browser, url: str, messages: int) -> tuple[float, float, int]:
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    page = await context.new_page()
    await page.goto(url)
    painted = await page.evaluate(PAINTED, messages)
    to_end = await page.evaluate(TO_THE_END, messages)
    elements = await page.locator(".bubble").count()
    await context.close()
    return painted, to_end, elements


def summary(name: str, values: list[tuple[float, float, int]]) -> str:
    paint = [v[0] for v in values]
    end = [v[1] for v in values]
    return (f"{name:9} first paint p50 {statistics.median(paint):7.0f} ms (min {min(paint):6.0f})   "
            f"to the end p50 {statistics.median(end):7.0f} ms (min {min(end):6.0f})   "
            f"message elements in the page {values[-1][2]}")


async def main(rounds: int, messages: int) -> None:
    if not CHROMIUM:
        raise SystemExit("Debian's chromium is not installed (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as home:
        async with Stack(Path(home)) as stack, async_playwright() as playwright:
            await long_session(stack, "long", messages)
            browser = await launch(playwright)
            urls = {"windowed": f"{stack.http_url}/#/sessions/long", "all": f"{stack.http_url}/?render=all#/sessions/long"}
            results: dict[str, list] = {name: [] for name in urls}
            await one_round(browser, urls["windowed"], messages)  # warm-up: caches, the gateway's first calls
            for _ in range(rounds):
                for name, url in urls.items():
                    results[name].append(await one_round(browser, url, messages))
            await browser.close()
    print(f"{messages} messages, {rounds} rounds, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for name, values in results.items():
        print(summary(name, values))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages", type=int, default=5000)
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.messages))
