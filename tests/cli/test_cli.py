"""`amp-harness`: its help is a contract, `list --json` a format, errors say what to do."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO
from helpers.browser import start_ui

from harness import cli
from harness.catalogue import claims
from harness.catalogue.scenario_source import claimed_tests
from harness.common import shown
from harness.records.journal import Journal
from harness.reports import report


def amp(*args: str, cwd) -> subprocess.CompletedProcess:
    """`amp-harness ARGS` as a user runs it. Not as an xdist worker: under `pytest -n`, the
    inherited PYTEST_XDIST_WORKER would make the inner session's pytest-benchmark warn that
    xdist disabled its benchmarks, an error under tox.ini's filterwarnings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args], cwd=cwd, capture_output=True, text=True,
        timeout=300, env=env,
    )  # fmt: skip


def test_help_lists_every_command():
    text = cli.parser().format_help()
    for command in ("run", "list", "sync", "ui", "sessions", "compare", "report", "baseline"):
        assert command in text
    assert "the recorded sessions: id, start, commit, hardware class" in " ".join(text.split())


SCENARIO = """
import pytest

@pytest.mark.claim("FMT-BYTES")
def test_bytes(record):
    record.verdict("FMT-BYTES", "confirmed", "fp16 2 bytes, fp32 4 bytes")
"""


def test_run_ends_with_the_session_id_it_recorded(pytester, capsys):
    """`compare` takes session ids, and `amp-harness run` printed none. (pytester: its folder
    is the current one, and the scenario module leaves sys.modules with it.)"""
    pytester.makepyfile(**{"scenarios/test_run_id": SCENARIO})
    pytester.makeini("[pytest]\n")  # the rootdir: scenarios/ is in it
    code = cli.main(["run", "--amp-device=cpu", "--no-mlflow", "-p", "no:cacheprovider"])
    assert code == 0
    (session,) = Journal(pytester.path / "reports" / "journal.jsonl").index()
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == (
        f"session {session[:12]}: compare it with another, `amp-harness compare ID "
        f"{session[:12]}`; every session: `amp-harness sessions`"
    )


TIERED = """
import pytest

@pytest.mark.claim("FMT-BYTES")
def test_bytes(record):
    record.verdict("FMT-BYTES", "confirmed", "fp16 2 bytes, fp32 4 bytes")

@pytest.mark.slow
@pytest.mark.claim("FMT-BITS")
def test_bits(record):
    record.verdict("FMT-BITS", "confirmed", "fp16 5 exponent bits")
"""


SLOW_LEFT_OUT = "1 slow test(s) left out, of FMT-BITS (`amp-harness run --all` runs them)"


@pytest.mark.parametrize(
    ("source", "options", "ran", "left_out"),
    [
        (TIERED, [], {"test_bytes"}, SLOW_LEFT_OUT),
        (TIERED, ["--all"], {"test_bytes", "test_bits"}, None),
        (TIERED, ["-k", "bits"], {"test_bits"}, "tests selected with -k 'bits'"),  # the user's
        (TIERED, ["-m", "slow"], {"test_bits"}, "tests selected with -m 'slow'"),
        (TIERED, ["scenarios/test_tiers.py::test_bits"], {"test_bits"}, "tests named one by one"),
        # A project without slow tests: the quick run is the whole suite (a baseline can be saved)
        (SCENARIO, [], {"test_bytes"}, None),
        pytest.param(TIERED, ["-n", "2"], {"test_bytes"}, SLOW_LEFT_OUT, marks=pytest.mark.slow),
    ],
    ids=["default", "all", "own-k", "own-m", "named", "none-slow", "xdist"],
)
def test_run_leaves_out_the_slow_tests_unless_asked_and_says_so(
    pytester, capsys, source, options, ran, left_out
):
    """The first run is quick: tests marked slow wait for --all or a selection of the user's,
    and the session says what it left out and how to run it (under xdist too, whose controller
    collects nothing: its workers tell it)."""
    pytester.makepyfile(**{"scenarios/test_tiers": source})
    pytester.makeini("[pytest]\n")
    code = cli.main(["run", "--amp-device=cpu", "--no-mlflow", "-p", "no:cacheprovider", *options])
    assert code == 0
    (session,) = Journal(pytester.path / "reports" / "journal.jsonl").sessions().values()
    assert {r.test.split("::")[-1] for r in session.records} == ran
    out = " ".join(capsys.readouterr().out.split())
    if left_out is None:
        assert session.end["left_out"] == [] and ": the whole suite" in out
    else:
        assert left_out in " ".join(session.end["left_out"]) and left_out in out


@pytest.mark.slow
def test_run_list_baseline_and_report(tmp_path, capsys, monkeypatch):
    shutil.copytree(REPO / "scenarios", tmp_path / "scenarios")
    shutil.copy(REPO / "tox.ini", tmp_path)
    # The scenario folder as it is, a user's own scenarios included: the selection names the
    # module, so what else the folder holds does not change what runs.
    selection = "test_formats and bytes"
    ran = amp("run", "--amp-device=cpu", "-k", selection, "-p", "no:cacheprovider", cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    assert "Where to look next" in ran.stdout
    assert "report: " in ran.stdout and (tmp_path / "reports/report/index.html").exists()
    listed = amp("list", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = {row["id"]: row for row in json.loads(listed.stdout)}
    builtin = list(claims.builtin())
    assert list(rows)[: len(builtin)] == builtin  # then the project's own claims, if any
    assert {"id", "statement", "source", "tests", "last_verdict"} <= set(rows["FMT-BYTES"])
    assert rows["BF16-NO-SCALER"]["source"].startswith("Kalamkar et al. 2019")
    assert any("test_formats.py::" in t for t in rows["FMT-BYTES"]["tests"])
    assert rows["FMT-BYTES"]["last_verdict"] == "confirmed"
    assert rows["FMT-BITS"]["last_verdict"] is None  # not run by `-k ...`
    assert [c for c in builtin if not rows[c]["tests"]] == []  # every claim has a scenario

    # `-k bytes` ran part of the suite: no baseline unless asked, and then marked incomplete.
    refused = amp("baseline", "save", cwd=tmp_path)
    assert refused.returncode == 2 and not (tmp_path / "reports" / "baselines").exists()
    assert (
        f"not a complete run of the suite: tests selected with -k '{selection}'" in refused.stderr
    )
    assert "--partial" in refused.stderr
    saved = amp("baseline", "save", "--partial", cwd=tmp_path)
    assert saved.returncode == 0, saved.stderr
    assert f"marked incomplete (--partial): tests selected with -k '{selection}'" in saved.stdout
    (path,) = (tmp_path / "reports" / "baselines").glob("cpu-*_torch-*.json")
    summary = json.loads(path.read_text())
    assert not summary["complete"] and summary["fingerprint"]["device"] == "cpu"
    again = amp("baseline", "save", "--partial", cwd=tmp_path)
    assert again.returncode == 2 and "exists (session " in again.stderr
    assert "pass --force to replace it" in again.stderr
    assert amp("baseline", "save", "--partial", "--force", cwd=tmp_path).returncode == 0
    assert [v["claim"] for v in summary["verdicts"]] == ["FMT-BYTES"]
    (test,) = summary["tests"].values()
    assert test["outcome"] == "passed" and test["metrics"]

    # The report compares the last session with that baseline, found by its environment. In
    # this process, where MLflow is imported already (2-3 s of a process of its own).
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert cli.main(["report"]) == 0, capsys.readouterr().err
    page = (tmp_path / "reports" / "report" / "index.html").read_text()
    assert "no verdict changed, no decision lost, no metric flagged (1 verdicts" in page


def test_baseline_without_a_session_says_what_to_do(tmp_path, capsys):
    assert cli.main(["baseline", "save", "--reports", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'journal.jsonl'}: no journal was written here" in err
    assert "amp-harness run` first" not in err  # names what is there, never a step to redo


def test_a_session_without_verdicts_is_not_saved_as_a_baseline(tmp_path, capsys):
    # A session that stopped at collection (seen: a GPU run whose MLflow did not import).
    session = {"type": "session", "session_id": "s1", "name": "n", "started": 0.0, "args": [],
               "fingerprint": {"device": "cpu", "cpu": "x86_64", "torch": "2.11.0"}}  # fmt: skip
    (tmp_path / "journal.jsonl").write_text(json.dumps(session) + "\n")
    code = cli.main(["baseline", "save", "--reports", str(tmp_path), "--out", str(tmp_path)])
    assert code == 2
    assert "recorded no verdict in 0 tests: not saved" in capsys.readouterr().err
    assert not list(tmp_path.glob("cpu-*.json"))


def test_run_outside_a_checkout_says_where_to_run(tmp_path, capsys):
    assert cli.main(["run", "--scenarios", str(tmp_path / "nowhere")]) == 2
    assert "no scenario folder" in capsys.readouterr().err


def test_sync_to_a_dead_server_fails_clearly_and_keeps_the_journal(tmp_path, capsys):
    journal = tmp_path / "journal.jsonl"
    session = {"type": "session", "session_id": "s1", "name": "n", "started": 0.0, "args": [],
               "fingerprint": {}}  # fmt: skip
    journal.write_text(json.dumps(session) + "\n")
    code = cli.main(["sync", "--reports", str(tmp_path), "--tracking-uri", "http://127.0.0.1:9"])
    assert code == 2
    assert "sync stopped" in capsys.readouterr().err
    assert journal.read_text().count("\n") == 1


@pytest.mark.parametrize("argv", [["list", "--bogus"], ["frobnicate"]])
def test_bad_arguments_are_usage_errors(argv):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2


def test_ui_serves_the_embedded_store_on_loopback(tmp_path, monkeypatch):
    started = fake_ui(monkeypatch)
    assert cli.main(["ui", "--reports", str(tmp_path)]) == 0
    ((command, options),) = started
    assert options["start_new_session"]  # its own process group: a stop reaches every worker
    assert command[command.index("--workers") + 1] == "1"
    assert command[command.index("--host") + 1] == "127.0.0.1"
    assert command[command.index("--backend-store-uri") + 1] == f"sqlite:///{tmp_path}/mlflow.db"


# --- `amp-harness ui` and `sync`: what they say when something is wrong (issue 12) -----------


def fake_ui(monkeypatch) -> list[tuple[list[str], dict]]:
    """`amp-harness ui` without the server: the commands it would start, with their options."""
    started = []

    class Exited:  # a server that ended at once, with status 0
        def __init__(self, command, **kwargs):
            started.append((command, kwargs))

        def poll(self):
            return 0

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(cli.store.subprocess, "Popen", Exited)
    return started


def test_ui_on_a_taken_port_says_so_and_exits_2(tmp_path, monkeypatch, capsys):
    started = fake_ui(monkeypatch)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert cli.main(["ui", "--reports", str(tmp_path), "--port", str(port)]) == 2
    out, err = capsys.readouterr()
    assert f"--port {port}: port {port} on 127.0.0.1 is taken" in err
    assert "pass another port, e.g. --port" in err
    assert "MLflow UI starting" not in out and started == []


def test_ui_beyond_loopback_warns_that_it_answers_the_network(tmp_path, monkeypatch, capsys):
    started = fake_ui(monkeypatch)
    with socket.socket() as probe:  # a port free now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert (
        cli.main(["ui", "--reports", str(tmp_path), "--host", "0.0.0.0", "--port", str(port)]) == 0
    )
    err = capsys.readouterr().err
    assert "warning: --host 0.0.0.0: the MLflow UI answers the network" in err
    assert "no authentication" in err and len(started) == 1
    assert cli.main(["ui", "--reports", str(tmp_path), "--port", str(port)]) == 0
    assert capsys.readouterr().err == ""  # loopback: nothing to warn about


def test_ui_serves_a_store_whose_path_has_a_question_mark(tmp_path, monkeypatch):
    """The escaped URI (`%3F`) would make MLflow create a folder of that name beside the real
    one: the UI runs inside the reports folder, on the store's plain file name."""
    started = fake_ui(monkeypatch)
    reports = tmp_path / "we?ird" / "reports"
    reports.mkdir(parents=True)
    assert cli.main(["ui", "--reports", str(reports)]) == 0
    ((command, options),) = started
    assert command[command.index("--backend-store-uri") + 1] == "sqlite:///mlflow.db"
    assert options["cwd"] == reports


@pytest.mark.slow
def test_sync_to_a_dead_or_hanging_server_is_one_line_without_the_password(
    tmp_path, capsys, monkeypatch
):
    # What is said, not how soon: a user's timeout wins over the harness's 4 s, and 1 s makes the
    # hanging server's two tries cost 3 s instead of 9 (tests/reports/test_report.py holds a
    # hanging server to the harness's own bounds).
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
    session = {"type": "session", "session_id": "s1", "name": "n", "started": 0.0, "args": [],
               "fingerprint": {}}  # fmt: skip
    (tmp_path / "journal.jsonl").write_text(json.dumps(session) + "\n")
    with socket.socket() as hanging:
        hanging.bind(("127.0.0.1", 0))
        hanging.listen(16)  # the kernel completes the handshakes; nobody ever reads
        port = hanging.getsockname()[1]
        for uri, cause in (
            ("http://amp:amp-secret-9@127.0.0.1:9", "Connection refused"),
            (f"http://:amp-secret-9@127.0.0.1:{port}", "Read timed out"),
        ):
            code = cli.main(["sync", "--reports", str(tmp_path), "--tracking-uri", uri])
            out, err = capsys.readouterr()
            assert code == 2 and out == ""
            (line,) = err.strip().splitlines()
            assert line.startswith("amp-harness: error: sync stopped: MLflow at http://")
            assert cause in line and "amp-harness sync --reports" in line
            assert "amp-secret-9" not in line  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_ui_stopped_with_sigterm_or_sighup_frees_its_port_and_leaves_nothing_running(
    tmp_path, stop
):  # SIGHUP: a closed terminal, a dropped ssh
    ui, port, lines = start_ui(tmp_path)  # an empty store: no runs page to print
    group = None
    try:
        assert lines[-1].strip() == f"MLflow UI answering on http://127.0.0.1:{port}", lines
        (server,) = [pid for pid, facts in _processes().items() if facts[1] == ui.pid]
        group = _processes()[server][2]  # the server's process group: it and its worker
        assert len(_in_group(group)) >= 2
        ui.send_signal(stop)
        ui.wait(timeout=30)
    finally:
        if ui.poll() is None:
            ui.kill()
        ui.wait()
        deadline = time.monotonic() + 15
        while group and _in_group(group) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = _in_group(group) if group else []
        if left:  # a server left running (it holds the pipe open too): ended here, always
            os.killpg(group, signal.SIGKILL)
        ui.communicate()  # and closes its pipe
    assert left == []
    with pytest.raises(ConnectionRefusedError):  # nothing listens there any more
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    with socket.socket() as again:  # and a new UI can bind it (as servers do, past TIME_WAIT)
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))


def _processes() -> dict[int, tuple[str, int, int]]:
    """pid -> (state, parent pid, process group) of every process, from /proc."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[int(stat.parent.name)] = (fields[0], int(fields[1]), int(fields[2]))
    return found


def _in_group(group: int) -> list[int]:
    return [
        pid for pid, (state, _ppid, pgrp) in _processes().items() if pgrp == group and state != "Z"
    ]


@pytest.mark.slow
def test_list_reads_the_claims_from_the_files_without_importing_torch(tmp_path):
    # What made `amp-harness list` take 5 s: collecting the scenarios imported torch.
    probe = (
        "import sys; from harness import cli; "
        f"cli.main(['list', '--json', '--reports', {str(tmp_path)!r}]); "
        "print('torch imported:', 'torch' in sys.modules, file=sys.stderr)"
    )
    ran = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0 and ran.stderr.strip().endswith("torch imported: False"), ran.stderr
    rows = {row["id"]: row for row in json.loads(ran.stdout)}
    assert rows["PIT3-ZERO-ALL"]["tests"] == [
        "scenarios/test_distributed.py::test_a_rank_of_zero_gradients_adds_zero",
        "scenarios/test_distributed.py::test_nccl_and_fsdp_on_two_gpus",
    ]


@pytest.mark.slow
def test_list_benchmark_takes_a_fraction_of_importing_torch(benchmark, tmp_path):
    """`amp-harness list` answers in under a second. pytest-benchmark records its time (the
    benchmark table, --benchmark-json); the check is a ratio measured side by side, so that a
    busy machine does not fail it: list takes less than half of what `import torch` alone
    takes here, which is what made it take 5 s (measured on 2 cores: 0.33 s against 1.3 s)."""

    def run(*argv: str) -> float:
        started = time.perf_counter()
        subprocess.run([sys.executable, *argv], cwd=REPO, check=True, capture_output=True)
        return time.perf_counter() - started

    listing = ["-m", "harness.cli", "list", "--json", "--reports", str(tmp_path)]
    benchmark.pedantic(run, args=listing, rounds=3, warmup_rounds=1)
    # Interleaved, the fastest of three each: a busy moment slows both, or neither.
    timed = [(run(*listing), run("-c", "import torch")) for _ in range(3)]
    list_s, torch_s = (min(times) for times in zip(*timed, strict=True))
    benchmark.extra_info.update(list_s=round(list_s, 3), import_torch_s=round(torch_s, 3))
    assert list_s < 0.5 * torch_s, f"list took {list_s:.2f} s; import torch {torch_s:.2f} s"


BUILT_AT_RUN_TIME = """
import pytest

def claim_id():
    return "FMT-" + "BITS"

@pytest.mark.claim(claim_id())
def test_bits(record):
    record.verdict("FMT-BITS", "confirmed", "5 exponent bits, 10 mantissa bits")
"""


def test_list_collects_a_file_whose_markers_are_built_at_run_time(tmp_path, monkeypatch, capsys):
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "test_built.py").write_text(BUILT_AT_RUN_TIME)
    monkeypatch.chdir(tmp_path)
    assert claimed_tests(tmp_path / "scenarios") is None  # not readable from the file
    assert cli.main(["list", "--json", "--reports", str(tmp_path / "reports")]) == 0
    rows = {row["id"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["FMT-BITS"]["tests"] == ["scenarios/test_built.py::test_bits"]


def test_ui_on_a_folder_that_is_not_there_says_so_and_makes_nothing(tmp_path, monkeypatch, capsys):
    """`ui --reports <typo>` made the folder and an empty store, and served it."""
    started = fake_ui(monkeypatch)
    typo = tmp_path / "reprots"
    assert cli.main(["ui", "--reports", str(typo)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"--reports {typo}: no such folder" in line and "--reports reports" in line
    assert not typo.exists() and started == []


def test_report_name_too_long_for_a_folder_is_one_line_before_reading_mlflow(tmp_path, capsys):
    """300 characters passed the name check and ended in ENAMETOOLONG once the report was
    built; 242 (255 less the temporary names beside it) works."""
    code = cli.main(["report", "--reports", str(tmp_path), "--name", "r" * 300,
                     "--tracking-uri", "http://127.0.0.1:9"])  # fmt: skip
    assert code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--name of 300 characters is too long" in line and "at most 242" in line
    assert report.report_dir(tmp_path, "r" * 242) == tmp_path / ("r" * 242)


LONG_TEST = "test_gradient_explosion.py::test_clipping_before_unscale_clips_scaled_gradients"


@pytest.mark.parametrize("encoding", ["utf-8", "ascii"])
@pytest.mark.parametrize("width", [300, 80, 41])
def test_list_in_a_log_prints_blocks_that_fit_its_width_and_keep_every_word(width, encoding):
    """Outside a terminal (a CI log, a pipe) `list` prints a block per claim, wrapped at the
    width: every line fits (the ASCII ones exactly; CJK takes two cells a character), every word
    of every field is kept, in what the encoding shows, and text is data, never terminal
    control. A table (rich's, a millisecond a row) is for a terminal and a few hundred claims."""
    from rich.cells import cell_len

    rows = [
        {"id": c.id, "statement": c.statement, "source": c.source,
         "shown_tests": ["test_a.py::test_b", LONG_TEST], "shown_verdict": "-"}
        for c in claims.builtin().values()
    ]  # fmt: skip
    hostile = {"id": "TEAM-HOSTILE", "statement": "[/bold] " + "x" * 90,
               "source": "\x1b[2J\tcaf\u00e9", "shown_tests": ["a", "b"],
               "shown_verdict": "refuted"}  # fmt: skip
    rows.append(hostile)
    drawn = cli.listing._claim_blocks("the title", rows, width, encoding)
    drawn.encode(encoding)  # it shows on such a terminal as it is
    assert "\x1b" not in drawn  # data (`\\x1b[2J`, kept), never terminal control
    assert drawn.endswith("\n")  # what a script prints next starts on a line of its own
    assert all(cell_len(line) <= width for line in drawn.splitlines())  # CJK: 2 cells a char
    words = "".join(drawn.split())
    for row in rows:
        for field in ("id", "statement", "source"):
            shown_text = shown.for_encoding(shown.visible(row[field]), encoding)
            assert "".join(shown_text.split()) in words, (field, row[field])


def test_a_test_id_too_long_for_a_line_breaks_after_its_file_not_inside_a_word():
    from harness.reports.table import indented

    lines = indented(f"tests: test_advice.py::test_the_norm, {LONG_TEST}, test_x.py::t", 80, "  ")
    assert lines == [
        "  tests: test_advice.py::test_the_norm,",
        "    test_gradient_explosion.py::",
        "    test_clipping_before_unscale_clips_scaled_gradients, test_x.py::t",
    ]


def test_runs_hints_name_the_folder_and_the_store_the_session_used(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run_a = tmp_path / "runA"  # pytest's --amp-reports, passed on by `run`, wins over --reports

    def hints(*pytest_args: str) -> str:
        session = cli.run._session_options("reports", list(pytest_args))
        return "\n".join(cli.run._next_steps(session))

    nothing_yet = hints("--amp-reports", str(run_a))  # names only what is there: no journal,
    assert "journal.jsonl" not in nothing_yet and "amp-harness ui" not in nothing_yet  # no store
    run_a.mkdir()
    (run_a / "journal.jsonl").write_text('{"type": "session"}\n')
    (run_a / "mlflow.db").touch()
    embedded = hints("--amp-reports", str(run_a))
    assert f"`amp-harness list --reports {run_a}`" in embedded
    assert f"`amp-harness ui --reports {run_a}`" in embedded
    assert f"  {run_a / 'journal.jsonl'}  every result" in embedded
    assert "reports/journal.jsonl" not in embedded
    server = hints("--tracking-uri", "http://amp:s3cret@127.0.0.1:5999")
    assert "amp-harness ui" not in server and "s3cret" not in server
    assert "127.0.0.1:5999  the tracking server: browse and compare the runs there" in server
    assert "amp-harness ui" not in hints("--no-mlflow")  # no store to browse


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path):
    """`amp-harness known-bugs | head -1`: the pipe closes before the command has written; it
    stops as `cat` does (status 141, SIGPIPE's), without a traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "known-bugs", "--reports", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    proc.stdout.close()  # before the interpreter has even started: its first write fails
    _, errors = proc.communicate(timeout=120)
    assert proc.returncode == 141 and errors == b"", errors.decode()
