"""report.html of a real bench, train and doctor run, opened in headless Chromium at a desktop's width (1280 CSS px)
and at a phone's (390 CSS px, mobile emulation: the page's viewport meta tag decides its layout width).

Each page must load with no console error and no script error, every figure (an inline PNG) must decode, as many
as the run wrote PNGs, no text may be smaller than 12 CSS px, and the page itself must never scroll sideways: a
wide table scrolls inside its own box (`ampkit.report.document`'s `.scroll`). A page that breaks any of this is
shown to be caught (a broken image, a script error, a console error, a table wider than the phone, fine print, no
viewport meta tag). Full-page screenshots go to `$AMPKIT_SCREENSHOTS` or a pytest temporary folder, named at the
end of pytest's output (tests/conftest.py's terminal summary).

The browser is Debian's `chromium` (`make test` installs it with apt-get where it can), driven by playwright
(pinned in the Makefile; it cannot download its own browsers here), launched once for the module. Where either
is missing the module is skipped, in one line.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from ampkit.report import Report, plt

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _no_browser() -> str | None:
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed (make test installs it)"
    if CHROMIUM is None:
        return "no chromium on PATH (make test installs Debian's with apt-get where it runs as root)"
    return None


if (_why := _no_browser()) is not None:
    pytest.skip(f"no headless browser: {_why}", allow_module_level=True)

RUNS = ("bench", "train", "doctor")  # tests/helpers.py REAL_RUNS, shared with the suite
WIDTHS = (390, 1280)  # CSS px: a phone (iPhone 12-15's 390 x 844) and a desktop window
PHONE_MAX = 600  # widths below this are emulated as a phone (touch, viewport meta tag honoured)
SMALLEST_TEXT = 12  # CSS px: the smallest text a page may set (a phone shows CSS px as they are)

_FACTS = r"""() => {
  const root = document.documentElement, width = root.clientWidth;
  const past = (x) => x.getBoundingClientRect().right > width + 0.5;
  const clipped = (x) => {  // inside a box of its own that scrolls (or clips) sideways
    for (let p = x.parentElement; p && p !== document.body; p = p.parentElement)
      if (getComputedStyle(p).overflowX !== 'visible') return true;
    return false;
  };
  const outside = [];  // the outermost elements that reach past the viewport's right edge
  for (const e of document.body.querySelectorAll('*'))
    if (past(e) && !past(e.parentElement) && !clipped(e))
      outside.push(e.tagName.toLowerCase() + ' ' + (e.innerText || '').replace(/\s+/g, ' ').trim().slice(0, 40));
  const images = [...document.images].map((i) => ({alt: i.alt, complete: i.complete, natural: i.naturalWidth,
                                                    shown: i.getBoundingClientRect().width}));
  let smallest = null;  // the smallest text: [CSS px, tag] of the elements that hold text themselves
  for (const e of document.body.querySelectorAll('*'))
    if ([...e.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim())) {
      const size = parseFloat(getComputedStyle(e).fontSize);
      if (smallest === null || size < smallest[0]) smallest = [size, e.tagName.toLowerCase()];
    }
  return {scrollWidth: root.scrollWidth, clientWidth: width, outside, images, smallest};
}"""
"""What the page looks like once loaded: its layout and scroll widths (CSS px), what pokes out of it, its images."""


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium for the module (a launch is ~0.5 s; each page gets its own context)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])  # root: no sandbox
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory) -> Path:
    folder = os.environ.get("AMPKIT_SCREENSHOTS")
    path = Path(folder) if folder else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def open_page(browser: Any, url: str, *, width: int, screenshot: Path | None = None) -> tuple[dict, list[str]]:
    """Load `url` at `width` CSS px: the page's facts (`_FACTS`) and every problem it reported while loading
    (console errors, uncaught script errors, failed requests), after an optional full-page screenshot."""
    phone = width < PHONE_MAX
    context = browser.new_context(
        viewport={"width": width, "height": 844}, is_mobile=phone, has_touch=phone, device_scale_factor=1
    )
    problems: list[str] = []
    page = context.new_page()
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"script error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url[:80]}"))
    try:
        page.goto(url, wait_until="load")
        facts = page.evaluate(_FACTS)
        if screenshot is not None:
            page.screenshot(path=str(screenshot), full_page=True)
    finally:
        context.close()
    return facts, problems


def faults(facts: dict, problems: list[str], *, width: int) -> list[str]:
    """Everything that makes a page unreadable at `width`, one line each (empty: it reads)."""
    out = list(problems)
    if facts["clientWidth"] != width:  # a phone without the viewport meta tag lays the page out at 980 px
        out.append(f"laid out {facts['clientWidth']} px wide in a {width} px viewport")
    if facts["scrollWidth"] > facts["clientWidth"]:
        out.append(f"the page scrolls sideways: {facts['scrollWidth']} px > {facts['clientWidth']} px")
    out += [f"past the right edge: {what}" for what in facts["outside"]]
    if facts["smallest"] is not None and facts["smallest"][0] < SMALLEST_TEXT:
        out.append(f"text smaller than {SMALLEST_TEXT} px: {facts['smallest'][0]:.1f} px in a <{facts['smallest'][1]}>")
    for image in facts["images"]:
        if not image["complete"] or image["natural"] == 0:
            out.append(f"figure did not load: {image['alt']!r}")
        elif image["shown"] > facts["clientWidth"]:
            out.append(f"figure wider than the page: {image['alt']!r}")
    return out


def test_a_broken_page_is_caught(browser, tmp_path):
    """The check can fail: a truncated PNG, a script error, a console error, a 40-column table and 9 px text are each
    named."""
    wide = "<table><tr>" + "".join(f"<td>column {i}</td>" for i in range(40)) + "</tr></table>"
    page = tmp_path / "broken.html"
    page.write_text(
        "<!doctype html><html><head><meta name='viewport' content='width=device-width'></head><body>"
        "<img alt='truncated' src='data:image/png;base64,iVBORw0KGgo='>"
        "<p style='font-size:9px'>fine print</p>"
        f"<script>noSuchFunction()</script><script>console.error('logged')</script>{wide}</body></html>"
    )
    facts, problems = open_page(browser, page.as_uri(), width=390)
    found = "\n".join(faults(facts, problems, width=390))
    assert "figure did not load: 'truncated'" in found
    assert "script error: " in found and "noSuchFunction" in found
    assert "console error: logged" in found
    assert "the page scrolls sideways" in found and "past the right edge: table column 0" in found
    assert "text smaller than 12 px: 9.0 px in a <p>" in found


def test_a_phone_without_the_viewport_tag_is_caught(browser, tmp_path):
    page = tmp_path / "desktop-only.html"
    page.write_text("<!doctype html><html><body><p>laid out for a desktop</p></body></html>")
    facts, problems = open_page(browser, page.as_uri(), width=390)
    assert faults(facts, problems, width=390) == ["laid out 980 px wide in a 390 px viewport"]


def test_a_wide_table_of_a_report_scrolls_in_its_box(browser, tmp_path):
    """The page shell alone: a table as wide as the broken page's, a long unbroken word and a figure read at 390 px."""
    fig, ax = plt.subplots(figsize=(9, 3))
    ax.plot([0, 1], [1, 0])
    report = Report("wide").table([f"column {i}" for i in range(40)], [list(range(40))])
    report.text("x" * 200).figure(fig, caption="a 9-inch figure")
    html_path, _ = report.write(tmp_path)
    facts, problems = open_page(browser, html_path.as_uri(), width=390)
    found = faults(facts, problems, width=390)
    assert not found, "; ".join(found)
    assert [i["alt"] for i in facts["images"]] == ["a 9-inch figure"]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("run", RUNS)
def test_a_real_report_reads_in_chromium(browser, real_runs, screenshots, record_property, run, width):
    run_dir = real_runs[run].run_dir
    shot = screenshots / f"{run}-{width}px.png"
    facts, problems = open_page(browser, (run_dir / "report.html").as_uri(), width=width, screenshot=shot)
    record_property("screenshots", str(screenshots))  # printed at the end of pytest's output
    found = faults(facts, problems, width=width)
    assert not found, f"{run}'s report at {width} px: " + "; ".join(found)
    figures = sorted(run_dir.glob("report-fig*.png"))
    assert figures and len(facts["images"]) == len(figures)  # every figure the run wrote is on the page
    assert shot.read_bytes().startswith(b"\x89PNG")
