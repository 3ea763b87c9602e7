"""Headless Chromium for the tests that read what a person sees (the report, the MLflow UI) and
for scripts/screenshots: where Chromium is, `amp-harness ui` started and stopped, and the few
steps of MLflow 3.17's runs list a person takes (playwright drives the system's Chromium: it
downloads no browser).

The MLflow selectors are the UI's own names: its search box's placeholder, its grid's column
ids (run names, tags) and its rows' indices. A new MLflow that renames them fails these tests
with the selector named, which is the point: the docs and the screenshots describe that UI."""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.records.tracking import ui_url
from helpers.servers import free_port

CHROMIUM = shutil.which("chromium") or next(
    (p for p in ("/usr/bin/chromium",) if Path(p).exists()), None
)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="needs chromium (Debian: apt-get install -y chromium)"
)
SEARCH_BOX = re.compile(r"metrics\.rmse")  # the runs list's search box, by its placeholder
RUN_NAMES = '[role="gridcell"][col-id="attributes.`Run Name`"]'
LISTED = re.compile(r"\d+ matching runs?")  # the runs list's footer


def start_ui(reports: Path, timeout_s: float = 240) -> tuple[subprocess.Popen, int, list[str]]:
    """`amp-harness ui` on a free port, as a person starts it, once it says that it answers (or
    has ended): the process, its port, and the lines it printed. Said neither within timeout_s
    (the UI waits 120 s for its server, then for the server to end: one that never answers kept
    the UI, and the pipe read here, open for ever, a hung xdist worker), it is stopped as a
    terminal stops it, its server with it, and the lines so far are returned."""
    port = free_port()
    ui = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "ui", "--reports", str(reports), "--port",
         str(port)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: list[str] = []
    said = threading.Event()

    def read() -> None:
        for line in ui.stdout:  # "starting", then "answering" once /health answers
            lines.append(line)
            if "answering" in line:
                break
        said.set()  # or it ended

    threading.Thread(target=read, daemon=True).start()
    if not said.wait(timeout_s):
        ui.send_signal(signal.SIGTERM)  # it stops its server's process group, then ends
        try:
            ui.wait(timeout=30)
        except subprocess.TimeoutExpired:
            ui.kill()
            ui.wait()
        said.wait(30)
    return ui, port, list(lines)


@contextlib.contextmanager
def mlflow_ui(reports: Path) -> Iterator[str]:
    """`amp-harness ui` (start_ui); yields the runs page it prints, and stops it with SIGTERM
    (SIGKILL if it hangs)."""
    ui, _port, lines = start_ui(reports)
    try:
        found = re.search(r"; the runs: (\S+)", lines[-1] if lines else "")
        assert found, f"`amp-harness ui` printed no runs page: {lines}"
        yield found.group(1)
    finally:
        ui.send_signal(signal.SIGTERM)
        try:
            ui.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            ui.kill()
            ui.communicate()


@contextlib.contextmanager
def browser_page(width: int = 1600, height: int = 1000):
    """A page of the system's headless Chromium, kept off the network but for loopback."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
            ],
        )
        try:
            yield browser.new_page(viewport={"width": width, "height": height})
        finally:
            browser.close()


def open_runs(page, url: str) -> None:
    """Open a runs page and wait for its list: the UI's answer, then the footer that counts the
    runs (on a loaded machine the footer says "0 matching runs" before the answer comes)."""
    with page.expect_response(lambda answer: "/runs/search" in answer.url, timeout=60_000):
        page.goto(url)
    page.get_by_text(LISTED).wait_for(timeout=60_000)
    close = page.get_by_role("button", name="Close")  # the assistant's panel, when it shows
    if close.count():
        close.first.click()


def search(page, query: str) -> None:
    """Type a search into the runs list, as a person does, and wait for the runs it found."""
    box = page.get_by_placeholder(SEARCH_BOX)
    box.fill(query)
    with page.expect_response(lambda answer: "/runs/search" in answer.url, timeout=30_000):
        box.press("Enter")
    page.get_by_text(LISTED).wait_for()
    page.wait_for_timeout(300)  # the grid draws the rows after the answer


def open_run_in_its_view(page, runs: str) -> None:
    """From the run page the UI shows (its own link drops the view), the same run as the report
    links it (tracking.ui_url: the model-training view). `runs`: the page `mlflow_ui` gave."""
    experiment, run = re.search(r"#/experiments/(\w+)/runs/(\w+)", page.url).groups()
    page.goto(ui_url(runs.split("/#/")[0], experiment, run))
    page.reload()  # a new address after the '#' alone loads nothing


def run_names(page) -> list[str]:
    """The run names the list shows, without the colour swatch's text."""
    return [text.split("\n")[-1] for text in page.locator(RUN_NAMES).all_inner_texts()]


RUN_NAME = "attributes.`Run Name`"  # the grid's column ids: RUN_NAME, "tags.`outcome`", ...
_CELLS = """() => {
    const found = {};
    for (const cell of document.querySelectorAll('.ag-row [col-id]')) {
        const row = cell.closest('.ag-row').getAttribute('row-index');
        (found[row] = found[row] || {})[cell.getAttribute('col-id')] = cell.innerText;
    }
    return found;
}"""


def grid(page) -> list[dict[str, str]]:
    """The rows of the runs list, top to bottom, each its cells' text by column id (RUN_NAME,
    "tags.`verdict.SCL-SCALE`", ...; a group's row too, named "Group: ..." by row_name). The
    grid draws only the columns in sight: it is scrolled across to read them all, then back."""
    across = page.locator(".ag-body-horizontal-scroll-viewport").first
    width, shown = across.evaluate("e => [e.scrollWidth, e.clientWidth]")
    rows: dict[int, dict[str, str]] = {}
    for left in [*range(0, max(width - shown, 0), max(shown, 100)), max(width - shown, 0)]:
        across.evaluate(f"e => {{ e.scrollLeft = {left}; }}")
        page.wait_for_timeout(300)  # the grid draws the columns scrolled into sight
        for index, cells in page.evaluate(_CELLS).items():
            rows.setdefault(int(index), {}).update(cells)
    across.evaluate("e => { e.scrollLeft = 0; }")
    return [rows[i] for i in sorted(rows)]


def row_name(row: dict[str, str]) -> str:
    """A grid row's name: a run's name, or a group's "Group: VALUE" (without its colour swatch
    and its count of runs)."""
    lines = row.get(RUN_NAME, "").splitlines()
    return next((line for line in lines if line.startswith("Group: ")), lines[-1] if lines else "")
