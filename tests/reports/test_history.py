"""Issue 50, item 7: history over time. Per claim and hardware class, the report says since when
its current verdict holds and draws a trend of each key metric that moved; `compare --range A..B`
names the session at which a verdict or a key metric changed. Sessions marked experimental, and
those of another class, stay out of both.

One history, written to the journal and to MLflow alike (the report reads MLflow, `compare` the
journal): class AVX512 runs torch 2.11 then 2.13; NUM-OVERFLOW flips from confirmed to refuted at
the first 2.13 session (a4), right after a run of part of the suite (a3) that left its test out;
NUM-UNDERFLOW's key metric drifts at a5; FMT-BITS and everything on class AVX2 hold (controls).
An experimental session between a5 and a6 says otherwise of everything, and must change nothing."""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from pathlib import Path

import pytest
from helpers.sessions import CPU, log_session, make_record
from helpers.tracked import store_in

from harness import cli
from harness.catalogue.claims import VERDICTS, catalogue
from harness.common.errors import HarnessError
from harness.records.journal import Journal
from harness.records.tracking import MlflowSink
from harness.reports import history, ledger, ledger_history, ledger_read, ranges, report

AVX512 = {**CPU, "hardware_class": "cpu-x86-64-avx512-bf16", "torch": "2.11.0+cpu"}
AVX2 = {**CPU, "hardware_class": "cpu-x86-64-avx2", "torch": "2.11.0+cpu"}
NEW = {"torch": "2.13.0+cpu"}
HOUR = 3600.0


def session_of(overflow: str, drift: float, bits: str = "confirmed", steady: float = 10.0) -> list:
    """A session's three tests: NUM-OVERFLOW's verdict, NUM-UNDERFLOW's key metric `flush_at`
    (its verdict holds), and FMT-BITS with its steady key metric `mantissa`."""
    made = [
        make_record("test_h.py::test_overflow", ["NUM-OVERFLOW"],
                    verdicts=[("NUM-OVERFLOW", overflow, f"65520 -> {overflow}")]),
        make_record("test_h.py::test_underflow", ["NUM-UNDERFLOW"],
                    verdicts=[("NUM-UNDERFLOW", "partly", "2e-8 -> 0")]),
        make_record("test_h.py::test_bits", ["FMT-BITS"],
                    verdicts=[("FMT-BITS", bits, "fp16 5/10 bits")]),
    ]  # fmt: skip
    made[1].key_metric(flush_at=drift)
    made[2].key_metric(mantissa=steady)
    return made


def record_session(journal: Journal, sink: MlflowSink, facts: dict, started: float,
                   records: list, left_out: tuple[str, ...] = (),
                   experimental: str | None = None) -> str:  # fmt: skip
    """A session as the plugin records it: the journal first, then MLflow. Its id."""
    entry = log_session(sink, facts, started, records, left_out=left_out,
                        experimental=experimental)  # fmt: skip
    sid = entry["session_id"]
    journal.append({"type": "session", **entry})
    for made in records:
        journal.append({"type": "record", "session_id": sid, "record": made.to_dict()})
    journal.append({"type": "session_end", "session_id": sid, "ended": started + 60,
                    "exitstatus": 0, "counts": {"passed": len(records)},
                    "left_out": list(left_out)})  # fmt: skip
    return sid


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, empty_store) -> tuple[Path, dict[str, str]]:
    """reports/ with the journal and the store of the module's history; the sessions' ids by
    name (a1..a6, x: AVX512; b1..b3: AVX2)."""
    reports = tmp_path_factory.mktemp("history") / "reports"
    sink = MlflowSink(store_in(reports, empty_store), reports=reports)
    journal = Journal(reports / "journal.jsonl")
    start = time.time() - 20 * HOUR
    ids = {}
    plan = [
        ("a1", AVX512, session_of("confirmed", 1.0), (), None),
        ("b1", AVX2, session_of("confirmed", 1.0), (), None),
        ("a2", AVX512, session_of("confirmed", 1.0), (), None),
        ("a3", AVX512, session_of("confirmed", 1.0)[2:], ("tests selected with -k bits",), None),
        ("b2", AVX2 | NEW, session_of("confirmed", 1.0), (), None),
        ("a4", AVX512 | NEW, session_of("refuted", 1.0), (), None),  # the verdict flips
        ("a5", AVX512 | NEW, session_of("refuted", 2.0), (), None),  # the key metric drifts
        ("x", AVX512 | NEW, session_of("partly", 9.0, "refuted", 11.0), (), "a new driver"),
        ("a6", AVX512 | NEW, session_of("refuted", 2.0), (), None),
        ("b3", AVX2 | NEW, session_of("confirmed", 1.0), (), None),
    ]
    for hour, (name, facts, made, left_out, experimental) in enumerate(plan):
        ids[name] = record_session(journal, sink, facts, start + hour * HOUR, made, left_out,
                                   experimental)  # fmt: skip
    return reports, ids


@pytest.fixture(scope="module")
def built(recorded) -> Path:
    reports, _ids = recorded
    return report.build(f"sqlite:///{reports / 'mlflow.db'}", report.report_dir(reports)).parent


def history_cells(page: str, claim: str) -> list[str]:
    """The claim's history cells, one per class: AVX2's, then AVX512's (the classes by name)."""
    section = page.split('<section id="history">')[1].split("</section>")[0]
    row = re.search(rf'<tr id="history-{claim}">(.*?)</tr>', section, re.S)
    assert row, f"no history row for {claim}"
    return [" ".join(cell.split()) for cell in re.findall(r"<td>(.*?)</td>", row[1], re.S)]


def when(recorded, name: str) -> str:
    """When the session `name` started, as the report and `compare --range` show it."""
    reports, ids = recorded
    return ledger.when(_started(reports, ids[name]))


def _started(reports: Path, sid: str) -> float:
    return Journal(reports / "journal.jsonl").index()[sid].entry["started"]


def test_the_report_says_since_when_each_verdict_holds_per_class(built, recorded):
    reports, ids = recorded
    page = (built / "index.html").read_text()
    avx2, avx512 = history_cells(page, "NUM-OVERFLOW")
    # It flipped at a4, the first session of torch 2.13; a3 did not run it, and the
    # experimental session's "partly" is no part of the record.
    a4 = f"session {_started(reports, ids['a4']):.0f}"
    assert f"since {when(recorded, 'a4')} ({a4}, torch 2.13.0+cpu; 3 sessions)" in avx512
    assert "confirmed ×2 → refuted ×3" in avx512 and 'class="bar"' in avx512
    assert "partly" not in avx512
    # The controls: held since the first session that ran them, drawn without a bar or a trend.
    b1 = f"session {_started(reports, ids['b1']):.0f}"
    first = f"since the first session that ran it, {when(recorded, 'b1')} ({b1}, torch 2.11.0+cpu"
    assert first in avx2 and "3 sessions" in avx2
    for cell in [avx2, *history_cells(page, "FMT-BITS")]:
        assert "since the first session that ran it" in cell
        assert 'class="bar"' not in cell and "<svg" not in cell
    section = page.split('<section id="history">')[1].split("</section>")[0]
    assert "history-FMT-RANGE" not in section  # no class ran it: no row
    assert "cpu-x86-64-avx512-bf16</strong>: 6 sessions of record" in section
    assert "torch 2.11.0+cpu, 2.13.0+cpu" in section


def test_a_trend_is_drawn_only_for_the_key_metric_that_moved(built, recorded):
    page = (built / "index.html").read_text()
    avx2, avx512 = history_cells(page, "NUM-UNDERFLOW")
    assert avx512.count("<svg") == 1 and "flush_at" in avx512
    assert f"1 → 2; last changed {when(recorded, 'a5')} (torch 2.13.0+cpu)" in avx512
    assert "<svg" not in avx2  # steady on this class
    # Five points of AVX512 drawn (a3 ran no test of it: no point), at two heights.
    (line,) = re.findall(r'<polyline points="([^"]*)"', avx512)
    heights = {point.split(",")[1] for point in line.split()}
    assert len(line.split()) == 5 and len(heights) == 2
    markdown = (built / "summary.md").read_text()
    history_md = markdown.split("## History per hardware class")[1].split("\n## ")[0]
    block = history_md.split("- **NUM-UNDERFLOW**\n")[1].split("\n- ")[0]
    avx2_md, avx512_md = block.strip("\n").splitlines()  # a line per class that ran it
    assert avx512_md.startswith("  - cpu-x86-64-avx512-bf16: **partly** since the first session")
    assert "; flush_at: ▁▁▁██ 1 → 2; last changed" in avx512_md and "flush_at" not in avx2_md
    assert "mantissa" not in markdown  # FMT-BITS's steady key metric draws nothing


def test_the_history_is_text_and_escaped():
    """A session name is data: escaped in the page and in summary.md."""
    point = history.Point("s", "<b>x</b> [a](javascript:1)", "2025-01-01 00:00", 1.0, "2.13",
                          None, {"FMT-BITS": ("confirmed", "confirmed")})  # fmt: skip
    (found,) = history.build({"cls": [point]})
    context = {"history": [found], "history_rows": ledger_history.rows([found]),
               "history_shown": history.SHOWN}  # fmt: skip
    text = "\n".join(report._history_markdown(context))
    assert "&lt;b>x&lt;/b> \\[a\\](javascript:1)" in text and "<b>" not in text


def compared_over(recorded, capsys, first: str, last: str) -> tuple[str, str]:
    """`compare --range` from session `first` to `last` of the store: its spec and output."""
    reports, ids = recorded
    capsys.readouterr()
    spec = f"{ids[first][:12]}..{ids[last][:12]}"
    assert cli.main(["compare", "--range", spec, "--reports", str(reports)]) == 0
    return spec, capsys.readouterr().out


def test_compare_range_names_the_session_where_each_change_happened(recorded, capsys):
    reports, ids = recorded
    spec, out = compared_over(recorded, capsys, "a1", "a6")
    blocks = dict(re.findall(r"^([A-Z0-9-]+)\n((?:  .*\n)+)", out, re.M))
    assert set(blocks) == {"NUM-OVERFLOW", "NUM-UNDERFLOW"}  # FMT-BITS held
    (flip,) = blocks["NUM-OVERFLOW"].splitlines()  # at a4, after a3 that left its test out
    assert flip.startswith(f"  {when(recorded, 'a4')} {ids['a4'][:12]} (session ")
    assert "verdict confirmed -> refuted" in flip
    (drift,) = blocks["NUM-UNDERFLOW"].splitlines()
    assert drift.startswith(f"  {when(recorded, 'a5')} {ids['a5'][:12]} (")
    assert "metric flush_at 1 -> 2" in drift
    assert ids["x"][:12] not in out and ids["b2"][:12] not in out  # experimental, other class
    assert "range " + spec + ": 6 sessions of record of class cpu-x86-64-avx512-bf16" in out
    assert out.rstrip().endswith("2 claims changed, at 2 of the sessions (5 steps, 13 verdicts "
                                 "compared)")  # fmt: skip
    assert cli.main(["compare", "--range", spec, "--reports", str(reports), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert [c["session"] for c in found["changes"]["NUM-OVERFLOW"]] == [ids["a4"]]
    assert [c["session"] for c in found["changes"]["NUM-UNDERFLOW"]] == [ids["a5"]]
    assert len(found["sessions"]) == 6


def test_compare_range_over_a_class_where_nothing_changed_says_so(recorded, capsys):
    _spec, out = compared_over(recorded, capsys, "b1", "b3")
    assert out.splitlines()[-1] == ("no verdict, decision or key metric changed over the range "
                                    "(2 steps, 6 verdicts compared)")  # fmt: skip
    assert not re.search(r"^[A-Z0-9-]+$", out, re.M)  # no claim named


@pytest.mark.parametrize(
    ("ends", "said"),
    [
        (("nosuch", "a6"), "no session 'nosuch'; the latest: "),
        (("a4", "a1"), "began before A, {A4}: give the older first, --range {a1}..{a4}"),
        (("a1", "b3"), "A ran on class cpu-x86-64-avx512-bf16 and B on cpu-x86-64-avx2"),
        (("a1", "x"), "is marked experimental: a new driver: a range is of the team's record"),
        (("a1", "a1"), "A and B are one session"),
        (("a1", ""), "give two sessions as A..B, the older first"),
    ],
)
def test_a_range_that_is_not_one_is_a_one_line_error_naming_the_fix(recorded, capsys, ends,
                                                                      said):  # fmt: skip
    reports, ids = recorded
    a, b = (ids.get(end, end)[:12] for end in ends)
    capsys.readouterr()
    assert cli.main(["compare", "--range", f"{a}..{b}", "--reports", str(reports)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith(f"amp-harness: error: --range {a}..{b}")
    named = f"{ids['a4'][:12]} (session {_started(reports, ids['a4']):.0f})"
    assert said.format(A4=named, a1=ids["a1"][:12], a4=ids["a4"][:12]) in error


def test_range_and_two_sessions_are_one_or_the_other(recorded, capsys):
    reports, ids = recorded
    spec = f"{ids['a1'][:12]}..{ids['a6'][:12]}"
    for argv in (
        ["compare", "last", "--range", spec],
        ["compare", "--range", spec, "--fail-on-regression"],
        ["compare"],
    ):
        capsys.readouterr()
        assert cli.main([*argv, "--reports", str(reports)]) == 2
        assert "--range A..B" in capsys.readouterr().err


def test_a_range_carries_the_tests_a_partial_session_left_out():
    """a3 ran part of the suite: the session after it is compared with a3's tests and, for the
    others, a2's. Pair by pair, a4's change would be compared with nothing."""
    full = {"lacks": [], "tests": {"t1": {"m": 1}, "t2": {"m": 2}},
            "verdicts": [{"test": "t1", "v": "a"}, {"test": "t2", "v": "b"}]}  # fmt: skip
    partial = {"lacks": ["-k t2"], "tests": {"t2": {"m": 3}},
               "verdicts": [{"test": "t2", "v": "c"}]}  # fmt: skip
    standing = ranges._standing(full, partial)
    assert standing["tests"] == {"t1": {"m": 1}, "t2": {"m": 3}}
    assert standing["verdicts"] == [{"test": "t1", "v": "a"}, {"test": "t2", "v": "c"}]
    assert ranges._standing(partial, full) is full  # a complete session is what stands


def test_since_counts_every_session_recorded_not_only_those_drawn():
    """The cap bounds the page, never the answer: a verdict that held over more sessions than
    are drawn says since when, and the bar draws only the last SHOWN."""
    points = [
        history.Point(f"s{i}", f"n{i}", f"w{i}", float(i), "2.13", None,
                      {"C": ("refuted", "refuted") if i < 3 else ("confirmed", "confirmed")},
                      {"C": {"t: m": float(i > 5)}})
        for i in range(10)
    ]  # fmt: skip
    (found,) = history.build({"cls": points}, shown=4)
    track = found.tracks["C"]
    assert (track.since.session, track.held, track.always) == ("s3", 7, False)
    assert [s.sessions for s in track.stretches] == [4] and found.capped
    assert "; the last 4 drawn" in found.words()
    assert track.trends == []  # over the 4 drawn, m held 1
    (trend,) = history.build({"cls": points}, shown=6)[0].tracks["C"].trends
    assert [p.session for p in trend.changed_at] == ["s6"] and trend.blocks() == "▁▁████"


def test_a_non_finite_key_metric_breaks_the_line_and_is_spelled_out():
    values = [1.0, float("inf"), 2.0, 3.0]
    partly = {"C": ("partly", "partly")}
    points = [history.Point(f"s{i}", "n", f"w{i}", float(i), "2.13", None, partly,
                            {"C": {"t: m": v}}) for i, v in enumerate(values)]  # fmt: skip
    (trend,) = history.build({"cls": points})[0].tracks["C"].trends
    assert len(trend.polylines()) == 2 and trend.blocks() == "▁·▅█"
    assert trend.words().startswith("1 → 3; last changed w3")


# --- cost: the report with its history, over a realistic store ------------------------------

# 50 sessions of 90 tests of one class under --stated-scale (4,500 runs); else 55 of 8: the cap
# (history.SHOWN) drawn all the same, in a tenth of the setup.
STATED, QUICK = (50, 90), (55, 8)
FLIP_EVERY, DRIFT_EVERY = 20, 7  # sessions: each test's verdict, a tenth of the key metrics


@pytest.fixture(scope="module")
def long_history(tmp_path_factory, stated_scale):
    """Sessions of one class through the live code path (the journal, then
    MlflowSink.log_record), in a RAM folder where there is one (tests/reports/test_report.py's
    many_runs says why): each test's verdict changes every FLIP_EVERY sessions, a tenth of the
    tests have a key metric that moves every DRIFT_EVERY. (reports, session ids, tests a session,
    seconds the logging took.)"""
    sessions, per = STATED if stated_scale else QUICK
    shm = Path("/dev/shm")
    ram = shm.is_dir() and os.access(shm, os.W_OK)
    with tempfile.TemporaryDirectory(dir=shm if ram else tmp_path_factory.mktemp("long")) as d:
        reports = Path(d) / "reports"
        sink = MlflowSink(f"sqlite:///{reports / 'mlflow.db'}", reports=reports)
        journal = Journal(reports / "journal.jsonl")
        claims, started, ids = list(catalogue()), time.perf_counter(), []
        for s in range(sessions):
            made = []
            for i in range(per):
                claim = claims[i % len(claims)]
                verdict = VERDICTS[(i + s // FLIP_EVERY) % len(VERDICTS)]
                made.append(make_record(f"test_long.py::test_{i}", [claim],
                                        verdicts=[(claim, verdict, f"test {i}: {s}")]))  # fmt: skip
                if i % 10 == 0:
                    made[-1].key_metric(step=float(s // DRIFT_EVERY))
            at = time.time() - HOUR * (sessions - s)
            ids.append(record_session(journal, sink, AVX512, at, made))
        yield reports, ids, per, time.perf_counter() - started


@pytest.mark.slow
def test_the_report_with_its_history_over_a_long_store(long_history, tmp_path, monkeypatch):
    """Timed and printed, never asserted (a loaded machine's seconds are no measure): the report
    with its history and without it, the history alone, and `compare --range` over them all."""
    reports, ids, per, setup_s = long_history
    uri = f"sqlite:///{reports / 'mlflow.db'}"
    report.build(uri, tmp_path / "warm")  # the first build imports Jinja2 and matplotlib
    with_s, index = timed(report.build, uri, tmp_path / "with")
    history_s, timeline = timed(ledger_history.per_class, _runs(uri), lambda run_id: run_id)
    with monkeypatch.context() as patch:
        patch.setattr(ledger_history, "per_class", lambda runs, link: [])
        without_s, _index = timed(report.build, uri, tmp_path / "without")
    spec = f"{ids[0][:12]}..{ids[-1][:12]}"
    range_s, found = timed(ranges.over, Journal(reports / "journal.jsonl"), spec)
    page = index.read_text()
    section = page.split('<section id="history">')[1].split("</section>")[0]
    print(f"{len(ids)} sessions x {per} tests logged in {setup_s:.1f} s; the report built in "
          f"{with_s:.2f} s with its history, {without_s:.2f} s without it; the history alone "
          f"{history_s:.2f} s; index.html {len(page):,} bytes, its history {len(section):,}; "
          f"compare --range over the {len(ids)} sessions {range_s:.2f} s")  # fmt: skip
    (drawn,) = timeline
    assert len(drawn.points) == len(ids) and drawn.capped == (len(ids) > history.SHOWN)
    lines = re.findall(r'<polyline points="([^"]*)"', section)
    assert lines and all(len(line.split()) <= history.SHOWN for line in lines)
    # The range names the sessions where verdicts flipped and where key metrics moved, only.
    named = {ids.index(step.session) for changes in found.by_claim().values()
             for step, _change in changes}  # fmt: skip
    assert named == {s for s in range(1, len(ids)) if s % FLIP_EVERY == 0 or s % DRIFT_EVERY == 0}


def timed(function, *args):
    started = time.perf_counter()
    found = function(*args)
    return time.perf_counter() - started, found


def _runs(uri: str) -> list:
    from harness.records import tracking

    client, experiment_id = ledger_read._open(uri, "amp-harness")
    return tracking.search_runs(client, experiment_id)


def test_experimental_sessions_and_other_classes_stay_out_of_the_history(built, recorded):
    """The experimental session x said `partly` and a `flush_at` of 9: nowhere in the history."""
    page = (built / "index.html").read_text()
    section = page.split('<section id="history">')[1].split("</section>")[0]
    assert "partly ×" not in section and "→ 9" not in section
    assert "cpu-x86-64-avx2</strong>: 3 sessions of record" in section


def test_a_bad_range_from_the_library_is_a_harness_error(recorded):
    reports, _ids = recorded
    with pytest.raises(HarnessError, match="give two sessions as A..B"):
        ranges.over(Journal(reports / "journal.jsonl"), "nodots")
