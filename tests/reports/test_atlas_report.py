"""The autocast atlas read back: the report's table (from MLflow) and `amp-harness baseline
changes` (from baselines), each cell marked where measurement and documentation disagree."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers.sessions import CPU, log_session, make_record

from harness.lab.autocast import docs as autocast_docs
from harness.records.tracking import MlflowSink, default_uri
from harness.reports import atlas, changes, report

TEST = "test_autocast_atlas.py::test_the_documented_autocast_lists_hold[{}]"
CLAIMS = ["AUTOCAST-LOWER-LIST", "AUTOCAST-UNLISTED"]
CODE = autocast_docs.CODES
HOSTILE = {**CPU, "torch": "2.13.0+cpu<script>alert(1)</script>|[x](javascript:y)"}


def atlas_record(dtype: str, behaviours: dict[str, str], mismatched: str, outcome="passed"):
    record = make_record(TEST.format(dtype), CLAIMS, outcome=outcome,
                         verdicts=[("AUTOCAST-UNLISTED", "partly", "1 of 2 ops")])  # fmt: skip
    record.param(autocast_dtype=dtype, mismatched_ops=mismatched)
    record.metric(**{f"op/{op}": CODE[b] for op, b in behaviours.items()})
    return record


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    reports = tmp_path_factory.mktemp("atlas") / "reports"
    sink = MlflowSink(default_uri(reports), reports=reports)
    measured = {"mm": "lower", "smooth_l1_loss": "float32", "add": "input"}
    log_session(sink, HOSTILE, time.time() - 60, [
        atlas_record("bfloat16", measured, "smooth_l1_loss"),
        # Measured, then failed: not shown as valid.
        atlas_record("float16", {**measured, "mm": "input"}, "mm,smooth_l1_loss", "failed"),
    ])  # fmt: skip
    return report.build(default_uri(reports), report.report_dir(reports)).parent


def test_the_report_shows_the_atlas_with_the_disagreeing_cell_marked(built):
    page = (built / "index.html").read_text()
    section = page.split('<section id="autocast-atlas">')[1].split("</section>")[0]
    assert (
        '<td class="atlas-differs" title="documented: no list">float32 ≠ documented no list'
        in section
    )
    assert "3 ops measured; 1 disagree" in section
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in section
    # Negative control: the failed float16 run's measurement is no column.
    assert ": float16</th>" not in section and ": bfloat16</th>" in section


def test_summary_md_lists_the_disagreeing_ops_escaped(built):
    summary = (built / "summary.md").read_text().split("## Autocast atlas")[1].split("\n## ")[0]
    (row,) = [line for line in summary.splitlines() if line.startswith("| smooth_l1_loss")]
    assert row == "| smooth_l1_loss | float32 ≠ documented no list |"
    assert "\\[x\\](javascript:y)" in summary and "\\|" in summary


def _baseline(torch: str, behaviours: dict[str, str]) -> dict:
    metrics = {f"op/{op}": float(CODE[b]) for op, b in behaviours.items()}
    entry = {"outcome": "passed", "claims": CLAIMS, "metrics": metrics}
    return {"fingerprint": {**CPU, "torch": torch}, "tests": {TEST.format("bfloat16"): entry}}


def test_baseline_changes_names_an_op_that_moved_with_its_release():
    group = [
        _baseline("2.4.1", {"conv_transpose2d": "lower", "mm": "lower"}),
        _baseline("2.5.1", {"conv_transpose2d": "lower", "mm": "lower"}),
        _baseline("2.6.0", {"conv_transpose2d": "float32", "mm": "lower"}),
    ]
    lines = changes._atlas(group)
    assert "### Autocast atlas, bfloat16: ops that changed" in lines
    (row,) = [line for line in lines if line.startswith("| conv")]
    # Measured: moved in 2.6 (made up here); documented: moved in 2.5 (the 2.5 docs, really).
    assert row == (
        "| conv_transpose2d | lower (2.4.1 to 2.5.1) → float32 (2.6.0) "
        "| float32 (2.4.1) → lower (2.5.1 to 2.6.0) |"
    )
    # Negative control: mm, the same everywhere in measurement and docs, is not listed.
    assert not any(line.startswith("| mm ") for line in lines)


def test_atlas_columns_read_behaviours_back_from_their_codes():
    column = atlas.column("x", "cpu", "2.13.0", {"op/mm": 1.0, "loss": 3.0, "op/eig": -2.0}, {})
    assert column.behaviours == {"mm": "lower", "eig": "absent"}


COMPILED = "test_compiled_atlas.py::test_compiled_ops_keep_eager_autocast[bfloat16-aot_eager]"


def test_a_compiled_column_marks_ops_that_differ_from_eager_not_from_the_docs():
    """A compiled atlas column (scenarios/test_compiled_atlas.py) holds its ops to eager: a
    marked cell says so, and an op that broke the graph reads "not compiled"."""
    metrics = {"op/mm": 1.0, "op/lstm": 2.0, "op/ctc_loss": float(CODE["not compiled"])}
    params = {"compiled_backend": "aot_eager", "mismatched_ops": "lstm"}
    column = atlas.column("cpu: bfloat16, compiled (aot_eager)", "cpu", "2.13.0", metrics, params)
    table = atlas.table([column])
    cells = {op: atlas.cell_text(cells[0]) for op, cells in table.rows}
    assert cells == {"lstm": "float32, ≠ eager", "ctc_loss": "not compiled", "mm": "lower"}
    assert atlas.is_atlas_test(COMPILED)
    # Its per-op key metrics stay with its claim (a value that moved changes no behaviour the
    # table shows); the eager atlas's go to the table.
    assert atlas.per_claim(COMPILED, {"holds/mm": 1.0}) == {"holds/mm": 1.0}
    assert atlas.per_claim(TEST.format("bfloat16"), {"holds/mm": 1.0}) == {}


def test_baseline_changes_titles_a_compiled_atlas_by_dtype_and_backend():
    entry = {"outcome": "passed", "claims": ["CMP-ATLAS"], "metrics": {"op/mm": 1.0}}
    group = [
        {"fingerprint": {**CPU, "torch": torch}, "tests": {COMPILED: entry}}
        for torch in ("2.9.1", "2.13.0")
    ]
    assert "### Autocast atlas, bfloat16, compiled with aot_eager: ops that changed" in (
        changes._atlas(group)
    )
