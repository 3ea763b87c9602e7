"""The MLflow UI as a person meets it, in headless Chromium: `amp-harness ui` prints the page of
the runs; it opens in the view a team compares in (the test runs of every environment, grouped
by claim, with the verdict columns: a saved view of MLflow's, tracking.views), not MLflow 3's
GenAI overview nor one collapsed session; the other view groups by environment; the searches
docs/mlflow-ui.md gives find the runs there, one claim's runs compare side by side across
environments, and a run's description carries its evidence. Without a browser: what the views
hold, that a session saves them (and carries on where MLflow refuses one), the report's link,
and that docs/mlflow-ui.md shows the screenshots scripts/screenshots takes."""

from __future__ import annotations

import http.server
import json
import re
import threading
import time
from importlib.util import find_spec
from pathlib import Path

import pytest
from helpers.browser import (
    LISTED,
    RUN_NAME,
    browser_page,
    grid,
    mlflow_ui,
    needs_chromium,
    open_run_in_its_view,
    open_runs,
    row_name,
    run_names,
    search,
)
from helpers.sessions import CPU, GPU, log_session, make_record

from harness.records import tracking
from harness.records.mlflow import uris
from harness.records.tracking import (
    BY_CLAIM,
    BY_ENVIRONMENT,
    UI_VIEW,
    VIEW_TAG,
    MlflowSink,
    default_uri,
    ui_url,
    views,
)
from harness.reports import ledger_read, report

REPO = Path(__file__).resolve().parents[2]
needs_a_browser = [
    needs_chromium,
    pytest.mark.skipif(
        find_spec("playwright") is None, reason="needs playwright: pip install -e '.[dev]'"
    ),
    pytest.mark.slow,  # a server and a browser of their own
]
# Fingerprints as a session records them: each names its hardware class, which the views group by.
CPU_FACTS = {**CPU, "hardware_class": "cpu-x86-64-avx2"}
GPU_FACTS = {**GPU, "hardware_class": "NVIDIA-H200"}
CPU_GROUP = "Group: env.hardware_class: cpu-x86-64-avx2, env.torch: 2.13.0+cpu"
GPU_GROUP = "Group: env.hardware_class: NVIDIA-H200, env.torch: 2.11.0"


def _state(tag_value: str) -> dict:
    envelope = json.loads(tag_value)  # MLflow's saved view: name, times, its state as JSON
    assert isinstance(envelope["name"], str) and isinstance(envelope["createdAt"], int)
    return json.loads(envelope["state"])


@pytest.fixture(scope="module")
def two_environments(tmp_path_factory) -> Path:
    """One session on the CPU and one on a GPU, which disagree on SCL-SCALE."""
    reports = tmp_path_factory.mktemp("ui") / "reports"
    sink = MlflowSink(default_uri(reports), reports=reports)
    now = time.time()
    for facts, verdict, started in (
        (CPU_FACTS, "confirmed", now - 600),
        (GPU_FACTS, "refuted", now - 300),
    ):
        log_session(sink, facts, started, [
            make_record("test_s.py::test_scale", ["SCL-SCALE"],
                        verdicts=[("SCL-SCALE", verdict, f"scale 65536 on {facts['device']}")]),
            make_record("test_f.py::test_bits", ["FMT-BITS"],
                        verdicts=[("FMT-BITS", "confirmed", "5 exponent bits, 10 mantissa")]),
        ])  # fmt: skip
    return reports


# --- without a browser ---------------------------------------------------------------------


def test_the_views_hold_the_test_runs_grouped_with_a_verdict_column_per_claim():
    found = views(["SCL-SCALE", "FMT-BITS"])
    assert set(found) == {VIEW_TAG + BY_CLAIM, VIEW_TAG + BY_ENVIRONMENT}
    by_claim, by_environment = (_state(found[VIEW_TAG + k]) for k in (BY_CLAIM, BY_ENVIRONMENT))
    for state in (by_claim, by_environment):
        # The test runs alone, latest first, sorted by a key that makes MLflow fetch no parents
        # (start_time would bring every session back as a collapsed row).
        assert state["searchFilter"] == "tags.`amp.kind` = 'test'"
        assert (state["orderByKey"], state["orderByAsc"]) == ("attributes.end_time", False)
        verdicts = [c for c in state["selectedColumns"] if "verdict." in c]
        assert verdicts == ["tags.`verdict.FMT-BITS`", "tags.`verdict.SCL-SCALE`"]  # by id
        assert state["columnOrder"][0] == RUN_NAME and state["columnWidths"][RUN_NAME] >= 400
    assert [k["groupByData"] for k in by_claim["groupBy"]["groupByKeys"]] == ["claims"]
    assert [k["groupByData"] for k in by_environment["groupBy"]["groupByKeys"]] == [
        "env.hardware_class",
        "env.torch",
    ]
    assert views(["SCL-SCALE", "FMT-BITS"]) == found  # the same tags: rewritten on a change only


def test_a_catalogue_too_large_for_a_view_fills_it_to_mlflows_limit():
    claims = [f"PROJECT-C{i}" for i in range(10_000)]
    for value in views(claims).values():
        assert len(value) <= 20_000  # MLflow's limit on an experiment tag's value
        columns = [c for c in _state(value)["selectedColumns"] if "verdict." in c]
        assert 200 < len(columns) < len(claims)
        assert columns == [f"tags.`verdict.{c}`" for c in sorted(claims)[: len(columns)]]


def test_the_links_open_the_view_and_a_run_its_own_page():
    assert ui_url("http://h:5000/", "7") == (
        f"http://h:5000/#/experiments/7/runs?{UI_VIEW}&viewStateShareKey={BY_CLAIM}"
    )
    plain = ui_url("http://h:5000", "7", view=None)
    assert plain == f"http://h:5000/#/experiments/7/runs?{UI_VIEW}"
    assert ui_url("http://h:5000", "7", "r1") == f"http://h:5000/#/experiments/7/runs/r1?{UI_VIEW}"


def test_a_session_saves_the_views_and_the_report_links_the_first(two_environments, tmp_path):
    client = tracking.client(default_uri(two_environments))
    experiment = client.get_experiment_by_name("amp-harness")
    for key, value in views().items():
        assert experiment.tags[key] == value
    page = report.build(default_uri(two_environments), tmp_path / "report").read_text()
    link = ui_url(ledger_read.EMBEDDED_UI, experiment.experiment_id).replace("&", "&amp;")
    words = "the test runs of every environment, by claim"
    assert f'<a href="{link}" rel="noreferrer">{words}</a>' in page


def test_a_server_that_refuses_the_views_keeps_the_session_and_links_the_runs_list(
    tmp_path, monkeypatch
):
    too_long = {VIEW_TAG + BY_CLAIM: "x" * 20_001}  # over MLflow's limit: refused
    monkeypatch.setattr(uris, "views", lambda: too_long)  # where the sink looks it up
    sink = MlflowSink(default_uri(tmp_path / "reports"), reports=tmp_path / "reports")
    log_session(sink, CPU_FACTS, time.time(), [make_record("test_f.py::test_bits", ["FMT-BITS"])])
    assert sink.down is None
    assert any("refused the saved views" in note for note in sink.notes), sink.notes
    sink.uri = "http://mlflow.team.internal:5000"  # as browse() words a server's link
    sink.label = sink.uri
    assert sink.browse().endswith(f"/runs?{UI_VIEW}")  # the runs list: no view to open


@pytest.mark.parametrize("answer", [200, 500], ids=["saved", "refused"])
def test_the_ui_saves_the_views_in_a_store_without_them_or_links_the_runs_list(answer):
    """`amp-harness ui` on a store from before the views: it saves them through the server's
    API, as MLflow's "Save view" does, and prints the view; where the server refuses (a
    read-only store), the runs list. A server of this test's own, stopped at its end."""
    from harness import cli

    posted: list[dict] = []

    class Api(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # get-by-name: the experiment, with no view among its tags
            kind = {"key": "mlflow.experimentKind", "value": "custom_model_development"}
            self._send(200, {"experiment": {"experiment_id": "4", "tags": [kind]}})

        def do_POST(self):  # set-experiment-tag
            posted.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self._send(answer, {})

        def _send(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        page = cli.store._runs_page(url, "amp-harness")
    finally:
        server.shutdown()
        server.server_close()
    if answer == 200:
        assert page == ui_url(url, "4")
        assert {(t["experiment_id"], t["key"], t["value"]) for t in posted} == {
            ("4", key, value) for key, value in views().items()
        }
    else:
        assert page == ui_url(url, "4", view=None) and len(posted) == 1


def test_the_page_shows_the_screenshots_the_script_takes():
    page = (REPO / "docs" / "mlflow-ui.md").read_text()
    shown = set(re.findall(r"\(screenshots/(mlflow-[\w-]+\.png)\)", page))
    script = (REPO / "scripts" / "screenshots").read_text()
    taken = set(re.findall(r"\"(mlflow-[\w-]+\.png)\"", script))
    assert shown == taken and len(taken) >= 4, (shown, taken)
    for name in taken:
        assert (REPO / "docs" / "screenshots" / name).stat().st_size > 10_000, name
        assert f"| `{name}` |" in page, f"{name} is missing from the table of screenshots"


# --- in the browser --------------------------------------------------------------------------


def in_a_browser(test):
    """A server and a browser of their own: slow, and skipped without Chromium or playwright."""
    for mark in needs_a_browser:
        test = mark(test)
    return test


def _grouped(rows: list[dict[str, str]]) -> dict[str, list[dict[str, str]]]:
    """The grid's runs under the name of the group above them ("Group: FMT-BITS")."""
    found: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        name = row_name(row)
        if name.startswith("Group: "):
            found[name] = []
        else:
            assert found, f"a run above every group: {name}"
            found[list(found)[-1]].append(row)
    return found


@in_a_browser
def test_the_printed_link_opens_the_test_runs_of_both_environments_by_claim(two_environments):
    """The link `amp-harness ui` prints, on a store from before the views (a session of an older
    harness): the UI saves them, and the page shows the test runs of both environments, grouped
    by claim, with the verdict columns; the other view groups them by environment. The control:
    the runs list MLflow opens without the view, one collapsed row per session."""
    from playwright.sync_api import expect

    client = tracking.client(default_uri(two_environments))
    experiment = client.get_experiment_by_name("amp-harness").experiment_id
    for key in views():
        client.delete_experiment_tag(experiment, key)
    with mlflow_ui(two_environments) as runs, browser_page() as page:
        assert runs.endswith(f"?{UI_VIEW}&viewStateShareKey={BY_CLAIM}"), runs
        open_runs(page, runs)
        expect(page.get_by_text(LISTED)).to_have_text("4 matching runs", timeout=30_000)
        expect(page.get_by_text("Group by: claims")).to_be_visible()
        rows = grid(page)
        by_group = _grouped(rows)
        assert sorted(by_group) == ["Group: FMT-BITS", "Group: SCL-SCALE"], [
            row_name(r) for r in rows
        ]
        scale = sorted(
            (r[RUN_NAME], r["tags.`env.hardware_class`"], r["tags.`env.torch`"],
             r["tags.`verdict.SCL-SCALE`"], r["tags.`outcome`"])
            for r in by_group["Group: SCL-SCALE"]
        )  # fmt: skip
        assert scale == [
            ("SCL-SCALE confirmed · test_scale", "cpu-x86-64-avx2", "2.13.0+cpu", "confirmed",
             "passed"),
            ("SCL-SCALE refuted · test_scale", "NVIDIA-H200", "2.11.0", "refuted", "passed"),
        ]  # fmt: skip
        bits = sorted(r["tags.`verdict.FMT-BITS`"] for r in by_group["Group: FMT-BITS"])
        assert bits == ["confirmed", "confirmed"]
        names = page.locator(f'[role="gridcell"][col-id="{RUN_NAME}"]').first.bounding_box()
        assert names["width"] >= 400  # names whole: claim, verdict, test

        # A page of its own: a new address after the '#' alone loads nothing, and a reload
        # raced MLflow rewriting the address (dropping the view's key) on a loaded runner.
        page.goto("about:blank")
        open_runs(page, ui_url(runs.split("/#/")[0], experiment, view=BY_ENVIRONMENT))
        expect(page.get_by_text("Group by: env.hardware_class")).to_be_visible(timeout=30_000)
        expect(page.get_by_text(LISTED)).to_have_text("4 matching runs", timeout=30_000)
        shown = {
            group: sorted(f"{row_name(r)}: {r['tags.`verdict.SCL-SCALE`']}" for r in runs_of)
            for group, runs_of in _grouped(grid(page)).items()
        }
        assert shown == {
            CPU_GROUP: ["FMT-BITS confirmed · test_bits: -",
                        "SCL-SCALE confirmed · test_scale: confirmed"],
            GPU_GROUP: ["FMT-BITS confirmed · test_bits: -",
                        "SCL-SCALE refuted · test_scale: refuted"],
        }  # fmt: skip

        # The control: the runs list as MLflow opens it without a view.
        page.goto(ui_url(runs.split("/#/")[0], experiment, view=None))
        page.reload()
        expect(page.get_by_text(LISTED)).to_have_text("6 matching runs", timeout=30_000)
        assert sorted(run_names(page)) == [f"session {n:.0f}" for n in sorted(
            float(r.data.tags["mlflow.runName"].split()[-1])
            for r in client.search_runs([experiment], "tags.`amp.kind` = 'session'")
        )]  # fmt: skip
        assert not any("verdict." in col for row in grid(page) for col in row)


@in_a_browser
def test_the_searches_of_the_page_find_the_runs_and_one_claim_compares_across_environments(
    two_environments,
):
    from playwright.sync_api import expect

    with mlflow_ui(two_environments) as runs, browser_page() as page:
        open_runs(page, runs)
        expect(page.get_by_text(LISTED)).to_have_text("4 matching runs", timeout=30_000)
        assert {
            "SCL-SCALE confirmed · test_scale",
            "SCL-SCALE refuted · test_scale",
            "FMT-BITS confirmed · test_bits",
        } <= set(run_names(page)), run_names(page)

        # docs/mlflow-ui.md's search by a claim's verdict, typed into the view; the other
        # verdict is the control.
        for verdict, other in (("confirmed", "refuted"), ("refuted", "confirmed")):
            search(page, f"tags.\"verdict.SCL-SCALE\" = '{verdict}'")
            found = [n for n in run_names(page) if n.startswith("SCL-SCALE")]
            assert found == [f"SCL-SCALE {verdict} · test_scale"], (verdict, run_names(page))
            assert f"SCL-SCALE {other}" not in " ".join(run_names(page))

        # One claim across environments: its runs, then MLflow's comparison of them.
        search(page, "tags.claims LIKE '%SCL-SCALE%'")
        found = sorted(n for n in run_names(page) if n.startswith("SCL-SCALE "))
        assert found == ["SCL-SCALE confirmed · test_scale", "SCL-SCALE refuted · test_scale"]
        rows = page.locator(".ag-row").filter(has_text=re.compile(r"SCL-SCALE \w+ · test_"))
        assert rows.count() == 2
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
