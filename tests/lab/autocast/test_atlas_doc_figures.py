"""The figures docs/autocast-atlas.md quotes for the compiled claims are what the committed
baselines (reports/baselines/cpu-*.json) hold: each quoted sentence is rebuilt from the
baselines' metrics and looked for in the page, so that a re-saved baseline that moves a figure
fails here until the page says it."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
DOC = REPO / "docs" / "autocast-atlas.md"


@dataclass(frozen=True)
class Figure:
    test: str  # a substring of the baseline test ids that hold the metric
    metric: str  # a prefix of the metrics read (every arm's, where it ends in "/")
    sentence: Callable[[list[float]], str]  # the page's words, from the values found


def _values(baselines: list[dict], test: str, metric: str) -> list[float]:
    """Per baseline that ran `test`, the largest of its metrics starting with `metric`."""
    found = []
    for baseline in baselines:
        for test_id, ran in baseline["tests"].items():
            held = [v for k, v in ran.get("metrics", {}).items() if k.startswith(metric)]
            if test in test_id and held:
                found.append(max(map(float, held)))
    return found


def _range(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:.2g}" if f"{low:.2g}" == f"{high:.2g}" else f"{low:.2g} to {high:.2g}"


FIGURES = {
    "loss curve": Figure(
        "test_compiled_training_follows_eager",
        "gap_over_spread/",
        lambda v: f"at most {_range(v)} of fp32's spread",
    ),
    "region backward, bfloat16": Figure(
        "test_disabled_region_computes_in_float32[bfloat16]",
        "backward_gap/aot_eager",
        lambda v: f"off float32 by {_range(v)} (bfloat16)",
    ),
    "region backward, float16": Figure(
        "test_disabled_region_computes_in_float32[float16]",
        "backward_gap/aot_eager",
        lambda v: f"or {_range(v)} (float16)",
    ),
    "region backward, eager": Figure(
        "test_disabled_region_computes_in_float32",
        "backward_gap/eager",
        lambda v: f"eager's is off by {_range(v)}",
    ),
    "harm, steps skipped": Figure(
        "test_disabled_region_harm_under_grad_scaler",
        "steps_skipped/aot_eager",
        lambda v: f"skips {_range(v)} of its 8 steps",
    ),
}


def stale(page: str, baselines: list[dict], figure: Figure) -> str | None:
    """None where the page holds the sentence the baselines give; else what it should say."""
    values = _values(baselines, figure.test, figure.metric)
    if not values:
        return f"no committed baseline holds {figure.metric} of {figure.test}"
    want = figure.sentence(values)
    return None if want in " ".join(page.split()) else f"the page should say {want!r}"


def _baselines() -> list[dict]:
    files = sorted((REPO / "reports" / "baselines").glob("cpu-*.json"))
    return [json.loads(f.read_text()) for f in files]


@pytest.mark.parametrize("name", FIGURES)
def test_the_page_quotes_what_the_baselines_hold(name):
    baselines, figure = _baselines(), FIGURES[name]
    if not _values(baselines, figure.test, figure.metric):
        pytest.skip(f"no committed baseline holds {figure.metric} of {figure.test} yet")
    problem = stale(DOC.read_text(), baselines, figure)
    assert problem is None, f"docs/autocast-atlas.md, {name}: {problem}"


def test_a_figure_the_baselines_moved_is_stale():
    """The check can fail: a page quoting 1/500 where the baselines hold 0.074 is stale, and
    the same page with the baselines' figure is not."""
    baselines = [
        {"tests": {"s.py::test_compiled_training_follows_eager": {"metrics": {
            "gap_over_spread/aot_eager": 0.0742, "gap_over_spread/inductor": 0.0741}}}},
        {"tests": {"s.py::test_compiled_training_follows_eager": {"metrics": {
            "gap_over_spread/aot_eager": 0.0016}}}},
    ]  # fmt: skip
    figure = FIGURES["loss curve"]
    old = "The loss curves stay within about 1/500 of fp32's spread."
    assert "0.0016 to 0.074" in stale(old, baselines, figure)
    assert stale("curves stay at most 0.0016 to 0.074 of fp32's spread", baselines, figure) is None
