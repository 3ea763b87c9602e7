"""The MLflow UI as a person meets it, in headless Chromium: `amp-harness ui` prints the page of
the runs; it opens on the runs list (not MLflow 3's GenAI overview), the test runs are named by
their claims and verdicts, the searches docs/mlflow-ui.md gives find them, one claim's runs
compare side by side across environments, and a run's description carries its evidence."""

from __future__ import annotations

import time
from importlib.util import find_spec
from pathlib import Path

import pytest
from browser import (
    LISTED,
    browser_page,
    expand_sessions,
    mlflow_ui,
    needs_chromium,
    open_run_in_its_view,
    open_runs,
    run_names,
    search,
)
from sessions import CPU, GPU, log_session, make_record

from harness.records.tracking import UI_VIEW, MlflowSink, default_uri

pytestmark = [
    needs_chromium,
    pytest.mark.skipif(
        find_spec("playwright") is None, reason="needs playwright: pip install -e '.[dev]'"
    ),
]


@pytest.fixture(scope="module")
def two_environments(tmp_path_factory) -> Path:
    """One session on the CPU and one on a GPU, which disagree on SCL-SCALE."""
    reports = tmp_path_factory.mktemp("ui") / "reports"
    sink = MlflowSink(default_uri(reports), reports=reports)
    now = time.time()
    for facts, verdict, started in ((CPU, "confirmed", now - 600), (GPU, "refuted", now - 300)):
        log_session(sink, facts, started, [
            make_record("test_s.py::test_scale", ["SCL-SCALE"],
                        verdicts=[("SCL-SCALE", verdict, f"scale 65536 on {facts['device']}")]),
            make_record("test_f.py::test_bits", ["FMT-BITS"],
                        verdicts=[("FMT-BITS", "confirmed", "5 exponent bits, 10 mantissa")]),
        ])  # fmt: skip
    return reports


@pytest.mark.slow
def test_the_runs_list_names_claims_and_verdicts_and_the_searches_find_them(two_environments):
    from playwright.sync_api import expect

    with mlflow_ui(two_environments) as runs, browser_page() as page:
        assert runs.endswith(f"?{UI_VIEW}")  # the model-training view, not GenAI's
        open_runs(page, runs)
        # 2 sessions, 4 tests. Waited for: on a loaded machine the footer first says
        # "0 matching runs", before the UI's answer comes.
        expect(page.get_by_text(LISTED)).to_have_text("6 matching runs", timeout=30_000)
        expand_sessions(page)
        names = run_names(page)
        assert {
            "SCL-SCALE confirmed · test_scale",
            "SCL-SCALE refuted · test_scale",
            "FMT-BITS confirmed · test_bits",
        } <= set(names), names

        # The README's search by a claim's verdict; the other verdict is the control.
        for verdict, other in (("confirmed", "refuted"), ("refuted", "confirmed")):
            search(page, f"tags.\"verdict.SCL-SCALE\" = '{verdict}'")
            expand_sessions(page)
            found = [n for n in run_names(page) if n.startswith("SCL-SCALE")]
            assert found == [f"SCL-SCALE {verdict} · test_scale"], (verdict, run_names(page))
            assert f"SCL-SCALE {other}" not in " ".join(run_names(page))

        # One claim across environments: its runs, then MLflow's comparison of them.
        search(page, "tags.claims LIKE '%SCL-SCALE%'")
        expand_sessions(page)
        found = sorted(n for n in run_names(page) if n.startswith("SCL-"))
        assert found == ["SCL-SCALE confirmed · test_scale", "SCL-SCALE refuted · test_scale"]
        rows = page.locator(".ag-row").filter(has_text="SCL-SCALE")
        for i in range(rows.count()):
            rows.nth(i).locator('input[type="checkbox"]').first.check()
        page.get_by_role("button", name="Compare").first.click()
        page.get_by_text("Comparing 2 Runs").wait_for(timeout=30_000)
        page.get_by_text("verdict.SCL-SCALE").first.wait_for()
        tags = dict(
            (line.split("\t")[0], sorted(line.split("\t")[1:]))
            for line in page.inner_text("body").splitlines()
            if line.startswith(("verdict.", "env.torch\t", "env.device\t"))
        )
        assert tags == {
            "verdict.SCL-SCALE": ["confirmed", "refuted"],
            "env.torch": ["2.11.0", "2.13.0+cpu"],
            "env.device": ["cpu", "cuda"],
        }, tags
        page.go_back()
        page.get_by_text(LISTED).wait_for()

        # A run's page: its description is the evidence. As the report links it (ui_url), it
        # opens in the model-training view (its sidebar: Runs, Models, Traces). The control: the
        # UI's own link from the list drops the view, and the run opens as a GenAI evaluation;
        # clicking "Model training" once sets the browser's default (docs/mlflow-ui.md).
        page.get_by_text("SCL-SCALE refuted · test_scale").first.click()
        page.get_by_text("scale 65536 on cuda").first.wait_for(timeout=30_000)
        assert "Evaluation runs" in page.inner_text("body")
        open_run_in_its_view(page, runs)
        page.get_by_text("scale 65536 on cuda").first.wait_for(timeout=30_000)
        shown = page.inner_text("body")
        assert "Evaluation runs" not in shown and "\nRuns\nModels\nTraces\n" in shown, shown[:300]
