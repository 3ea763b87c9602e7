"""The pytest face of the harness, registered through the `pytest11` entry point.

- options: --amp-device, --tracking-uri, --amp-reports, --amp-experiment, --no-mlflow,
  --amp-experimental (and its reason), --amp-baseline and --amp-fail-on-regression;
- markers: @pytest.mark.claim(IDs...) on every scenario test, checked at collection;
  @pytest.mark.requires(capabilities..., gpus=N) turned into readable skip reasons;
- fixtures: `amp_device` (the probed device) and `record` (what the test observed);
- around each scenario test: torch's global state (harness.records.torch_state) recorded with it,
  and a test that leaves it changed fails, naming what, with the state put back;
- after each scenario test: its record goes to the journal, then to MLflow; under pytest-xdist
  the controller records a test whose worker died;
- at the end: the verdict table, and the regressions against a baseline.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import platform
import re
import subprocess
import tempfile
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from harness.catalogue import claims, contract
from harness.catalogue.claims import catalogue, unknown_ids
from harness.catalogue.verdicts import CAPABILITY_REGRESSION
from harness.common import shown
from harness.common.errors import HarnessError
from harness.lab import devices, hardware
from harness.records import (
    environments,
    fingerprint,
    isolation,
    journal_index,
    stopsignals,
    torch_state,
    warned,
)
from harness.records.journal import JOURNAL_NAME, Journal
from harness.records.journal_index import EXPERIMENTAL, MARK, short_id
from harness.records.record import SCENARIO_DIGEST, Record
from harness.records.tracking import (
    DEFAULT_EXPERIMENT,
    MlflowSink,
    Running,
    command_line,
    redact,
    resolve_uri,
)
from harness.reports import accepted as accepted_changes
from harness.reports import baseline, compare, nearest
from harness.reports.table import cap, counts_line, for_terminal, indented

WORKER_FLAG = "--amp-worker-output"
_STATE = pytest.StashKey["AmpSession"]()
_RECORD = pytest.StashKey[Record]()
_OUTCOME = pytest.StashKey[list]()  # (outcome, message) per phase that did not pass
_REGRESSION = pytest.StashKey[devices.Lack]()  # a capability expected here, found missing
_TORCH_BEFORE = pytest.StashKey[dict]()  # torch's global state before the test's setup
_TORCH_SET_UP = pytest.StashKey[dict]()  # and once its fixtures are set up


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("amp-harness", "amp-harness: mixed-precision scenarios")
    group.addoption(
        "--amp-device",
        default="auto",
        choices=devices.DEVICE_CHOICES,
        help="device the scenarios run on: auto (CUDA when present), cpu or cuda",
    )
    group.addoption(
        "--tracking-uri",
        default=None,
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///REPORTS/mlflow.db)",
    )
    group.addoption(
        "--amp-reports",
        default=None,
        help="folder for the journal, the embedded MLflow store and figures (default: reports/)",
    )
    group.addoption("--amp-experiment", default=DEFAULT_EXPERIMENT, help="MLflow experiment name")
    group.addoption(
        "--amp-cpu-threads",
        type=_positive_int,
        default=1,
        help="torch threads for scenarios on the CPU (default 1: see README)",
    )
    group.addoption(
        "--amp-cpu-class",
        default=None,
        choices=tuple(hardware.HOLD),
        help="hold the CPU kernels (ATen's dispatch, oneDNN, MKL) to this class, to measure a "
        "lower class of CPU on this machine; the class in force is read back from torch and "
        "oneDNN, and a class not in force is an error",
    )
    group.addoption(
        "--no-mlflow",
        action="store_true",
        help="record to the journal only (replay later with `amp-harness sync`)",
    )
    group.addoption(
        "--amp-experimental",
        action="store_true",
        help="mark the session experimental: recorded, tagged amp.experimental=true in MLflow, "
        "and kept out of the team's record (the report's ledger, `baseline save`, `compare "
        "last`); `amp-harness sessions mark ID record` undoes it",
    )
    group.addoption(
        "--amp-experimental-reason",
        default=None,
        metavar="TEXT",
        help="why the session is experimental, recorded with its mark (implies --amp-experimental)",
    )
    group.addoption(
        "--amp-baseline",
        default=None,
        metavar="PATH|auto",
        help="at the end, compare the session with this baseline file; auto: this "
        "environment's in --amp-baselines, as `amp-harness baseline save` names it, else the "
        "nearest earlier torch release of its hardware class, then the nearest class (said)",
    )
    group.addoption(
        "--amp-baselines",
        default=None,
        metavar="DIR",
        help="the folder of committed baselines and their accepted-changes.toml (default: "
        "reports/baselines under the project's root)",
    )
    group.addoption(
        "--amp-fail-on-regression",
        action="store_true",
        help="fail the session when a verdict changed or a metric moved significantly against "
        "the baseline (--amp-baseline, auto when not given)",
    )
    group.addoption(
        "--amp-isolate",
        default="auto",
        choices=("auto", "all", "none"),
        help="run scenario tests each in its own process, so that a crash or a hang fails only "
        "that test: auto (tests marked isolated, and GPU tests), all, or none",
    )
    group.addoption(
        "--amp-timeout",
        type=_positive_int,
        default=900,
        help="seconds an isolated scenario test may run before it is killed (default 900)",
    )
    group.addoption(
        "--amp-gpu-per-worker",
        action="store_true",
        help="with pytest-xdist (-n N): give each worker a GPU of its own (CUDA_VISIBLE_DEVICES)",
    )
    group.addoption(WORKER_FLAG, default=None, help=argparse.SUPPRESS)  # internal: a worker
    parser.addini(
        "amp_scenarios", "folder of scenario modules, relative to rootdir", default="scenarios"
    )
    parser.addini(
        "amp_claims",
        "the project's claim catalogue, relative to rootdir (default: amp_scenarios/claims.toml)",
        default="",
    )
    parser.addini(
        "amp_capabilities",
        "the project's own capabilities, relative to rootdir (default: "
        "amp_scenarios/capabilities.py)",
        default="",
    )


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)


def _experimental(config: pytest.Config, started: float) -> dict:
    """The session entry's mark (journal_index.MARK) where --amp-experimental, or its reason,
    asks for one; its runs in MLflow are tagged from it."""
    reason = config.getoption("amp_experimental_reason")
    if not config.getoption("amp_experimental") and reason is None:
        return {}
    return {MARK: journal_index.mark(EXPERIMENTAL, reason or "", started)}


@dataclass
class AmpSession:
    """Per-session state, kept in config.stash (never module globals: pytester nests sessions)."""

    config: pytest.Config
    device: devices.DeviceInfo
    reports: Path
    scenarios: Path
    records: list[Record] = field(default_factory=list)
    journal: Journal | None = None
    sink: MlflowSink | None = None
    running: Running | None = None  # held while it runs: `amp-harness sync` leaves it alone
    entry: dict | None = None  # the journal's session entry, once tracking is open
    saved_threads: int | None = None
    baseline: Path | None = None  # the baseline file looked for (--amp-baseline)
    baseline_summary: dict | None = None  # its content; None when there is none at `baseline`
    baseline_why: str = ""  # why another environment's baseline was taken (auto), if it was
    accepted: list[accepted_changes.Entry] = field(default_factory=list)  # the reviewed changes
    comparison: compare.Comparison | None = None
    current: Record | None = None  # the test running now: recorded as interrupted on Ctrl-C
    worker_reports: list[dict] = field(default_factory=list)  # in a worker: for the parent
    shared: bool = False  # a pytest-xdist worker recording into its controller's session
    journal_warnings: list[str] = field(default_factory=list)  # entries the readers skipped
    journal_down: str = ""  # why the journal could not be appended to: the session stopped
    workers_rewrote: list[str] = field(default_factory=list)  # a vanished journal re-created
    selected: set[str] = field(default_factory=set)  # scenario tests this session set out to run
    end: dict | None = None  # the journal's session_end entry, once the session ended
    deselected: int = 0  # scenario tests deselected (-k, -m, --deselect, --lf, ...)
    slow_deselected: dict[str, list[str]] = field(default_factory=dict)  # test -> its claims

    def is_scenario(self, path: Path) -> bool:
        return Path(path).resolve().is_relative_to(self.scenarios)

    def open_tracking(self) -> None:
        """Called once scenario tests are collected; plain `pytest tests/` never tracks."""
        self.journal = Journal(self.reports / JOURNAL_NAME)
        self.journal.check_writable()
        xdist = getattr(self.config, "workerinput", {})
        self.config.add_cleanup(self.journal.close)
        if "amp_session" in xdist:  # a pytest-xdist worker: its controller opened the session
            self.entry, self.shared = xdist["amp_session"], True
            self.journal.keep(self.entry)
            if not self.config.getoption("no_mlflow"):
                uri = resolve_uri(self.config.getoption("tracking_uri"), self.reports)
                self.sink = MlflowSink(uri, self.config.getoption("amp_experiment"), self.reports)
                if xdist.get("amp_parent_run"):
                    self.sink.adopt_parent(self.entry, xdist["amp_parent_run"])
            return
        facts = fingerprint.collect(
            self.device, self.config.rootpath, (self.scenarios, claims.project_path())
        )
        self.open_baseline(facts)  # a bad baseline stops the session before anything is recorded
        uri = None
        if not self.config.getoption("no_mlflow"):  # a bad URI, too
            uri = resolve_uri(self.config.getoption("tracking_uri"), self.reports)
        started = time.time()
        self.entry = {
            "type": "session",
            "session_id": uuid.uuid4().hex,
            "name": f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(started))} "
            f"{environments.label(facts)}",
            "started": started,
            "host": platform.node(),
            "args": [redact(str(a)) for a in self.config.invocation_params.args],
            "fingerprint": facts,
            **_experimental(self.config, started),
        }
        self.entry = shown.storable(self.entry)  # a Latin-1 path in the args: escaped
        # Before the session is in the journal: a sync that sees it also sees that it runs.
        self.running = Running(self.journal.path.parent, self.entry["session_id"])
        self.config.add_cleanup(self.running.close)  # also when the session stops on an error
        self.journal.keep(self.entry)
        self.journal.append(self.entry)
        if uri:
            self.sink = MlflowSink(uri, self.config.getoption("amp_experiment"), self.reports)
            self.sink.start_session(self.entry)

    def open_baseline(self, facts: dict[str, str]) -> None:
        """Read and check the baseline before any test runs: a bad file stops the session now.

        `auto` takes this environment's baseline, else the nearest (harness.reports.nearest);
        none at all is reported at the end. A path given by hand that is not there is a mistake,
        said now, and so is a mistake in the accepted-changes file beside the baselines."""
        option = self.config.getoption("amp_baseline")
        if option is None and self.config.getoption("amp_fail_on_regression"):
            option = "auto"
        if option is None:
            return
        folder = self.baselines_folder()
        known = set(claims.catalogue())
        self.accepted = accepted_changes.read(accepted_changes.default_path(folder), known)
        if option == "auto":
            chosen = nearest.choose(folder, facts)
            self.baseline, self.baseline_summary = chosen.path, chosen.summary
            self.baseline_why = chosen.why
        else:
            self.baseline = self.config.invocation_params.dir / option
            self.baseline_summary = compare.read_baseline(self.baseline)

    def baselines_folder(self) -> Path:
        """--amp-baselines, else reports/baselines under the project's root: committed, so never
        under --amp-reports (what a session produces)."""
        option = self.config.getoption("amp_baselines")
        if option is None:
            return self.config.rootpath / "reports" / "baselines"
        return self.config.invocation_params.dir / option

    def left_out(self, recorded: set[str]) -> list[str]:
        """What of the scenario suite this session did not run, in words; [] for all of it.
        `recorded`: the tests it recorded."""
        found = []
        keyword, markexpr = (self.config.getoption(o, "") for o in ("keyword", "markexpr"))
        chosen = [f"{f} {value!r}" for f, value in (("-k", keyword), ("-m", markexpr)) if value]
        slow = self.slow_deselected if "slow" in markexpr else {}
        # `amp-harness run`'s own selection says nothing but the slow tests it left out, if any
        if chosen and not (markexpr == QUICK_TIER and not keyword):
            found.append(f"tests selected with {' '.join(chosen)}")
        elif self.deselected and not chosen:
            found.append(f"{self.deselected} scenario test(s) deselected")
        if slow:
            found.append(self._slow_left_out())
        named = [a for a in self.config.args if "::" in a]
        if named:
            found.append(f"tests named one by one: {', '.join(named)}")
        root = self.config.rootpath
        ran_modules = {(root / nodeid.split("::")[0]).resolve() for nodeid in self.selected}
        said = {(root / nodeid.split("::")[0]).resolve() for nodeid in slow}  # all slow, named
        modules = sorted(
            p.name for p in self.scenarios.glob("test_*.py") if p not in ran_modules | said
        )
        if modules:
            found.append(f"scenario modules not run: {', '.join(modules)}")
        never = sorted(self.selected - recorded)
        if never:
            found.append(f"{len(never)} selected test(s) never ran (-x, or a crash?)")
        return found

    def _slow_left_out(self) -> str:
        claim_ids = dict.fromkeys(c for ids in self.slow_deselected.values() for c in ids)
        return (
            f"{len(self.slow_deselected)} slow test(s) left out, of {', '.join(claim_ids)} "
            "(`amp-harness run --all` runs them)"
        )

    def compare_with_baseline(self, ending: dict) -> None:
        """Compare with the baseline before the session's end is recorded (a regression may
        fail the session): `ending` is the end entry to be."""
        if self.baseline_summary is not None:
            session = self.read_journal(
                lambda: baseline.summarize(self.journal, self.entry["session_id"], ending)
            )
            self.comparison = compare.compare(
                self.baseline_summary,
                session,
                labels=(str(self.baseline), "this session"),
                accepted=self.accepted,
            )

    def session_records(self) -> list[Record]:
        """This session's records; a pytest-xdist controller reads its workers' (and those of
        tests whose worker died, which it recorded itself) from the journal."""
        if self.journal is None or not _xdist_controller(self.config):
            return self.records
        sid = self.entry["session_id"]
        session = self.read_journal(self.journal.index)[sid]
        return self.journal.load([session])[sid].records

    def read_journal(self, read):
        """`read()` of the journal, its warnings (entries it skipped, naming file:line) kept to
        be shown under the verdict table: inside a session warnings may be errors, and a damaged
        line must not cost the session its table and its end."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = read()
        self.journal_warnings += [str(w.message) for w in caught]
        return result

    @property
    def worker_output(self) -> str | None:
        return self.config.getoption("amp_worker_output")

    def finish(self, record: Record) -> None:
        self.current = None
        # Text that is not clean UTF-8 (a file name in evidence, a skip reason) is escaped before
        # the record reaches anything: the journal, MLflow, the worker's file, the table.
        record.make_storable()
        record.message = redact(record.message)  # a failure may quote a URI with its password
        self.records.append(record)
        if self.journal is None:
            return
        entry = {
            "type": "record",
            "session_id": self.entry["session_id"],
            "record": record.to_dict(),
        }
        try:
            self.append(entry)
        except HarnessError as exc:  # a full disk: nothing more can be recorded, say so and stop
            self.journal_down = str(exc)
            pytest.exit(f"amp-harness: {exc}", returncode=pytest.ExitCode.INTERNAL_ERROR)
        if self.sink:
            self.sink.log_record(self.entry, record)

    def append(self, entry: dict) -> None:
        """Append `entry` to the journal, which re-creates itself if it vanished (Journal.keep).
        The lock that tells `amp-harness sync` this session runs went with its folder: it is
        taken again first, so that no sync ends the session's run while it still records."""
        if self.running is not None and self.journal.vanished():
            self.running.close()
            self.running = Running(self.journal.path.parent, self.entry["session_id"])
            self.config.add_cleanup(self.running.close)
        self.journal.append(entry)

    def rewrote(self) -> list[str]:
        """Each time this session's processes re-created a journal that vanished, in words."""
        return (self.journal.rewritten if self.journal else []) + self.workers_rewrote


# The selection `amp-harness run` makes unless --all, -k or -m: every scenario test but the slow.
QUICK_TIER = "not slow"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "claim(*ids): the catalogue claim IDs a scenario test checks (amp-harness list)"
    )
    config.addinivalue_line(
        "markers",
        "requires(*capabilities, gpus=0): skip with a reason unless the device has them "
        f"({', '.join(devices.CAPABILITY_TEXT)})",
    )
    config.addinivalue_line(
        "markers",
        "isolated: run in its own process (a crash or a hang fails only this test); GPU tests "
        "are isolated without it",
    )
    config.addinivalue_line(
        "markers",
        "timing: measures speed or memory; refuses to share its device with other xdist workers",
    )
    config.addinivalue_line(
        "markers",
        "slow: in scenarios/, a test that compiles or trains to convergence, tens of seconds on a "
        "2-core CPU: `amp-harness run` leaves it out unless --all (`pytest scenarios/` runs it)",
    )
    _pin_gpu(config)
    scenarios = (config.rootpath / config.getini("amp_scenarios")).resolve()
    # The project's own claims, beside its scenarios; a nested session restores the outer's.
    project = config.getini("amp_claims") or Path(scenarios, claims.PROJECT_FILE)
    config.add_cleanup(claims.use_project(config.rootpath / project))
    config.add_cleanup(stopsignals.as_ctrl_c())  # SIGTERM, SIGHUP: as Ctrl-C
    try:
        _hold_cpu_class(config.getoption("amp_cpu_class"))
        device = devices.with_team_capabilities(
            devices.resolve(config.getoption("amp_device")),
            config.rootpath
            / (config.getini("amp_capabilities") or Path(scenarios, devices.TEAM_CAPABILITIES)),
        )
        catalogue()  # a malformed catalogue stops the session here, with its file and field
    except HarnessError as exc:
        raise pytest.UsageError(str(exc)) from None
    reports = Path(config.getoption("amp_reports") or config.rootpath / "reports")
    if _runs_scenarios(config, scenarios):  # before pytest-xdist's workers start: they inherit it
        _keep_inductor_cache(config, reports.resolve())
    config.stash[_STATE] = AmpSession(config, device, reports.resolve(), scenarios)
    config.pluginmanager.register(_LastLines(config), "amp-harness-last-lines")


def _torch_default_cache() -> Path:
    """Where inductor caches when no folder is set, as torch computes it (tempdir/torchinductor_
    <user>); torch writes it into the environment the first time it looks (the device's probes
    make it look, through an optimizer step), so that there it is no user's choice."""
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
    return Path(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def _keep_inductor_cache(config: pytest.Config, reports: Path) -> None:
    """torch.compile's inductor builds each graph's kernels (C++ on the CPU, triton on CUDA) in
    seconds and caches them on disk, by default in /tmp/torchinductor_<user>, which a fresh
    runner does not keep: under the reports folder, a later session with the same folder (the
    next run on this machine, a CI job given the last one's reports/) reuses them. Triton's
    follows: inductor puts it under its own where TRITON_CACHE_DIR is unset. A folder the user
    set stands (torch's default in the environment is none). The environment is put back at
    the session's end, so that a session run inside another process leaves it as it found it."""
    default = _torch_default_cache()

    def chosen(name: str) -> bool:
        value = os.environ.get(name)
        return value is not None and not Path(value).resolve().is_relative_to(default.resolve())

    if chosen("TORCHINDUCTOR_CACHE_DIR"):
        return
    before = {n: os.environ.get(n) for n in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    if chosen("TRITON_CACHE_DIR"):
        del before["TRITON_CACHE_DIR"]
    for name in before:
        os.environ.pop(name, None)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(reports / "inductor-cache")

    def put_back() -> None:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    config.add_cleanup(put_back)


def _hold_cpu_class(level: str | None) -> None:
    """--amp-cpu-class: hold this process's CPU kernels (and its workers', which inherit the
    variables) to `level` before any probe runs them, and check that the class is in force."""
    if level is None:
        return
    held = hardware.hold(level)
    try:
        hardware.check_held(level)
    except hardware.NotInForce as exc:
        given = " ".join(f"{name}={value}" for name, value in held.items())
        raise HarnessError(f"--amp-cpu-class {level} ({given}): {exc}") from None


def _pin_gpu(config: pytest.Config) -> None:
    """--amp-gpu-per-worker: this pytest-xdist worker sees only its own GPU (set before CUDA
    starts in this process)."""
    gpus = getattr(config, "workerinput", {}).get("amp_gpus")
    if gpus is None:
        return
    index = int(config.workerinput["workerid"].removeprefix("gw"))
    if index >= len(gpus):
        raise pytest.UsageError(
            f"--amp-gpu-per-worker: {config.workerinput['workercount']} xdist workers but "
            f"{len(gpus)} GPU(s): use -n {len(gpus)} or fewer"
        )
    os.environ["CUDA_VISIBLE_DEVICES"] = gpus[index]


def _xdist_controller(config: pytest.Config) -> bool:
    return config.pluginmanager.hasplugin("dsession")


def _runs_scenarios(config: pytest.Config, scenarios: Path) -> bool:
    paths = [config.invocation_params.dir / a.split("::")[0] for a in config.args]
    return any(
        p.resolve().is_relative_to(scenarios) or scenarios.is_relative_to(p.resolve())
        for p in paths
    )


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist starts its workers
def pytest_sessionstart(session: pytest.Session) -> None:
    """Under pytest-xdist the controller opens the session (and creates the SQLite store:
    workers creating it at once would corrupt it); the workers record into it."""
    state = _state(session.config)
    if _xdist_controller(session.config) and _runs_scenarios(session.config, state.scenarios):
        try:
            state.open_tracking()
        except HarnessError as exc:
            raise pytest.UsageError(str(exc)) from None
        session.config.pluginmanager.register(_XdistController(state), "amp-harness-controller")


class _XdistController:
    """pytest-xdist's controller, which runs no test: it records a test whose worker died (kill
    -9, a segfault, the OOM killer) as --amp-isolate records one whose isolated worker did, and
    hears what workers re-wrote of a journal that vanished."""

    def __init__(self, state: AmpSession):
        self.state = state
        self.started: dict[str, dict] = {}  # node id -> its record as its setup began

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        started = getattr(report, "amp_record", None)
        if started is not None:
            self.started[report.nodeid] = started
        elif report.when == "teardown":
            self.started.pop(report.nodeid, None)

    @pytest.hookimpl(optionalhook=True, trylast=True)  # after a plugin that runs it again
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched) -> None:
        state = self.state
        if report.outcome != "failed" or not state.is_scenario(_node_path(state, crashitem)):
            return  # run again (pytest-rerunfailures), or not a scenario test
        worker = report.node
        died = _exit_status(worker)
        report.longrepr = (
            f"{crashitem} crashed: the worker died (pytest-xdist {worker.gateway.id}, "
            f"{isolation.how_it_ended(died) if died is not None else 'its exit status unknown'})"
        )
        started = self.started.pop(crashitem, None)
        record = Record.from_dict(started) if started else _crashed_before_setup(state, crashitem)
        _record_crash(state, record, report.longrepr)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        output = getattr(node, "workeroutput", {})
        self.state.workers_rewrote += output.get("amp_journal_rewritten", [])
        self.state.slow_deselected |= output.get("amp_slow_deselected", {})


def _exit_status(worker) -> int | None:
    """How a pytest-xdist worker's process ended (its Popen's return code: negative for a
    signal); None where execnet does not say (another kind of gateway, another version)."""
    popen = getattr(getattr(getattr(worker, "gateway", None), "_io", None), "popen", None)
    try:
        return popen.wait(timeout=5)  # its output closed as it died: it is reaped at once
    except (AttributeError, subprocess.TimeoutExpired):
        return None


def _node_path(state: AmpSession, nodeid: str) -> Path:
    return state.config.rootpath / nodeid.split("::")[0]


def _crashed_before_setup(state: AmpSession, nodeid: str) -> Record:
    """The record of a test whose worker died before its setup's report reached the controller
    (a fixture that crashed): its claims read from its file, without importing it."""
    path = _node_path(state, nodeid).resolve()
    test = f"{path}::{nodeid.partition('::')[2].split('[')[0]}"  # named without its parameters
    declared = contract.claimed_tests(path.parent) or {}
    claims = [claim for claim, tests in declared.items() if test in map(_from_the_root, tests)]
    return Record(nodeid, claims, state.device.describe(), _artifact_dir(state, nodeid))


def _from_the_root(test: str) -> str:
    """A test as contract.claimed_tests names it (its file from the current folder), its file
    from the root of the file system."""
    where, _, name = test.partition("::")
    return f"{(Path.cwd() / where).resolve()}::{name}"


def _record_crash(state: AmpSession, record: Record, message: str) -> None:
    """A test whose process died: what it had measured is lost with it, its failure is not."""
    record.outcome, record.message = "failed", message
    record.ended = time.time()
    state.finish(record)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """pytest-xdist: what each worker needs from the controller."""
    state = _state(node.config)
    if state.entry is not None:
        node.workerinput["amp_session"] = state.entry
        node.workerinput["amp_parent_run"] = state.sink.parent_run_id(state.entry) if (
            state.sink and not state.sink.down) else None  # fmt: skip
    if node.config.getoption("amp_gpu_per_worker"):
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        count = torch.cuda.device_count()
        node.workerinput["amp_gpus"] = visible.split(",") if visible else [
            str(i) for i in range(count)]  # fmt: skip


def _state(config: pytest.Config) -> AmpSession:
    return config.stash[_STATE]


def session_id(config: pytest.Config) -> str | None:
    """The id of the session `config` recorded (`amp-harness run` prints it last); None where it
    recorded none (nothing collected, a usage error)."""
    state = config.stash.get(_STATE, None)
    return state.entry["session_id"] if state and state.entry and not state.shared else None


def _claim_ids(item: pytest.Item) -> list[str] | None:
    markers = list(item.iter_markers("claim"))
    if not markers:
        return None
    return [claim_id for marker in markers for claim_id in marker.args]


def _contract_problems(item: pytest.Item) -> list[str]:
    ids = _claim_ids(item)
    if not ids:
        return [
            f"{item.nodeid}: no claim marker. Every scenario test names the claims it checks, "
            'e.g. @pytest.mark.claim("FMT-BITS"); `amp-harness list` shows the IDs.'
        ]
    return [
        f"{item.nodeid}: unknown claim ID {bad!r} in @pytest.mark.claim; closest valid IDs: "
        f"{near} (`amp-harness list` shows all)"
        for bad, near in unknown_ids(ids)
    ]


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    """A scenario module whose tests break the claim contract fails to collect, by name."""
    report = yield
    if report.passed and isinstance(collector, pytest.Module | pytest.Class):
        state = _state(collector.config)
        if state.is_scenario(collector.path):
            problems = [
                p
                for node in report.result
                if isinstance(node, pytest.Function)
                for p in _contract_problems(node)
            ]
            if problems:
                report.outcome = "failed"
                report.longrepr = "\n".join(problems)
    return report


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items:
        state = _state(items[0].config)
        scenarios = [item for item in items if state.is_scenario(item.path)]
        state.deselected += len(scenarios)
        state.slow_deselected |= {
            item.nodeid: _claim_ids(item) or []
            for item in scenarios
            if item.get_closest_marker("slow")
        }


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    """pytest-xdist: the controller learns what its workers collected (it collects nothing)."""
    state = _state(node.config)
    state.selected |= {i for i in ids if state.is_scenario(node.config.rootpath / i.split("::")[0])}


def pytest_collection_finish(session: pytest.Session) -> None:
    state = _state(session.config)
    if session.config.option.collectonly:
        return  # nothing runs, nothing to record
    state.selected = {item.nodeid for item in session.items if state.is_scenario(item.path)}
    if state.selected:
        if state.device.type == "cpu":
            # The scenarios' models are small: a second thread barely helps them, a fixed count
            # makes float reductions (and so the recorded numbers) the same on any machine, and
            # on a shared CPU idle OpenMP threads slow every step several times over.
            state.saved_threads = torch.get_num_threads()
            torch.set_num_threads(session.config.getoption("amp_cpu_threads"))
        if state.worker_output:
            return  # a worker's parent records what it runs
        try:
            state.open_tracking()
        except HarnessError as exc:
            raise pytest.UsageError(str(exc)) from None


@pytest.fixture(scope="session")
def amp_device(pytestconfig: pytest.Config) -> devices.DeviceInfo:
    """The device this session's scenarios run on, with its probed capabilities."""
    return _state(pytestconfig).device


@pytest.fixture
def record(request: pytest.FixtureRequest) -> Record:
    """What this scenario test observed: params, metrics, histories, figures, verdicts."""
    if _RECORD not in request.node.stash:
        raise HarnessError(
            f"{request.node.nodeid}: the `record` fixture is for scenario tests in "
            f"{_state(request.config).scenarios}"
        )
    return request.node.stash[_RECORD]


def _new_record(item: pytest.Item, state: AmpSession) -> Record:
    record = Record(
        test=item.nodeid,
        claims=_claim_ids(item) or [],
        device=state.device.describe(),
        artifact_dir=_artifact_dir(state, item.nodeid),
    )
    # What follows the hardware among what the test needs: where another class lacks it, the
    # test's verdicts there differ because of the hardware. A timing test's numbers depend on
    # the class as a whole.
    needs = {n for marker in item.iter_markers("requires") for n in marker.args}
    timing = {environments.CLASS} if item.get_closest_marker("timing") else set()
    follows = {n for n in needs if state.device.follows_hardware(n)}  # a team's too
    depends = follows | timing
    if depends:
        record.depends_on_hardware(*sorted(depends))
    record.param(**{SCENARIO_DIGEST: fingerprint.file_digest(item.path)})
    return record


def _artifact_dir(state: AmpSession, nodeid: str) -> Path:
    return state.reports / "records" / nodeid.replace("/", "_").replace("::", ".")


def _missing_requirement(item: pytest.Item, state: AmpSession) -> devices.Lack | None:
    """What the test needs and the device lacks: a regression first, wherever it is marked."""
    lacks = []
    for marker in item.iter_markers("requires"):
        try:
            lack = state.device.missing(*marker.args, **marker.kwargs)
        except (HarnessError, TypeError) as exc:
            raise HarnessError(f"{item.nodeid}: @pytest.mark.requires: {exc}") from None
        if lack:
            lacks.append(lack)
    return min(lacks, key=lambda lack: not lack.regression, default=None)


def _regression_message(lack: devices.Lack, claims: list[str]) -> str:
    text = f"{lack.reason}. Claims of this test: {', '.join(claims) or 'none'}."
    return f"{text}\nThe probe's traceback:\n{lack.error}" if lack.error else text


def _shared_device(item: pytest.Item, state: AmpSession) -> str | None:
    """Why a timing scenario refuses to run: other pytest-xdist workers use its device."""
    workers = int(getattr(item.config, "workerinput", {}).get("workercount", 1))
    if item.get_closest_marker("timing") is None or workers < 2:
        return None
    if state.device.type == "cuda" and item.config.getoption("amp_gpu_per_worker"):
        return None
    return (
        f"timing scenario refuses to share {state.device.describe()} with {workers - 1} other "
        "pytest-xdist workers: its numbers would measure them too; run it with -n 0, or with "
        "--amp-gpu-per-worker on a machine with a GPU per worker"
    )


def _isolated(item: pytest.Item, state: AmpSession) -> bool:
    mode = item.config.getoption("amp_isolate")
    if state.worker_output or mode == "none" or not state.is_scenario(item.path):
        return False
    if mode == "all":
        return True
    gpu = any("cuda" in marker.args for marker in item.iter_markers("requires"))
    marked = gpu or item.get_closest_marker("isolated") is not None
    # A test this device cannot run skips in-process: no worker for a skip.
    return marked and not _missing_requirement(item, state)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """An isolated test runs in a worker process; its reports and record come back from there,
    or, if the worker crashed or hung, reports that say so."""
    state = _state(item.config)
    if not _isolated(item, state):
        return None  # pytest's own protocol, in this process
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    state.current = _new_record(item, state)
    reports, record = isolation.run(
        item, state.device.type, state.reports, item.config.getoption("amp_timeout")
    )
    for report in reports:
        item.ihook.pytest_runtest_logreport(report=report)
    if record is None:  # the worker died
        _record_crash(state, state.current, _first_line(reports[1]))
    else:
        record.ended = time.time()
        state.finish(record)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


@pytest.hookimpl(tryfirst=True)  # before pytest's own skipping plugin reads the skip marks
def pytest_runtest_setup(item: pytest.Item) -> None:
    state = _state(item.config)
    if not state.is_scenario(item.path):
        return
    item.stash[_RECORD] = record = state.current = _new_record(item, state)
    item.stash[_OUTCOME] = []
    # What the test starts under, recorded with it: a precision flag set by a conftest or an
    # earlier non-scenario test changes its numbers as much as the fingerprint's do.
    item.stash[_TORCH_BEFORE] = before = torch_state.snapshot()
    record.param(**torch_state.as_params(before))
    lack = _missing_requirement(item, state)
    if lack and lack.regression:
        # Expected on this build and hardware, and broken: a failure, never a skip.
        item.stash[_REGRESSION] = lack
        pytest.fail(_regression_message(lack, record.claims), pytrace=False)
    reason = str(lack) if lack else _shared_device(item, state)
    if reason:
        # A skip mark, not pytest.skip(): the report then points at the test, not here.
        item.add_marker(pytest.mark.skip(reason=reason))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """Torch's warnings during a scenario are kept with its record, not made errors
    (harness.records.warned says why and which warnings count as torch's)."""
    if _RECORD not in item.stash:
        return (yield)
    kept: list[str] = []
    try:
        with warned.torch_warnings_kept() as kept:
            return (yield)
    finally:
        if kept:
            _keep_torch_warnings(item.stash[_RECORD], kept)


def _keep_torch_warnings(record: Record, kept: list[str]) -> None:
    """In the record, in fields of their own: a count (the metric) and the messages (the
    param), never in a verdict's evidence, which says what the scenario measured."""
    record.metric(**{warned.FIELD: len(kept)})
    record.param(**{warned.FIELD: cap(" | ".join(kept), "left out", chars=warned.PARAM_CHARS)})


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if _RECORD not in item.stash:
        return report
    record = item.stash[_RECORD]
    if call.excinfo is not None and isinstance(call.excinfo.value, devices.CapabilityRegression):
        item.stash[_REGRESSION] = call.excinfo.value.lack  # raised by DeviceInfo.optional
    _check_torch_state(item, call.when, report)
    if call.when == "setup" and hasattr(item.config, "workerinput"):
        # pytest-xdist: should this worker die during the test, its controller records it
        report.amp_record = shown.storable(record.to_dict())
    if call.when == "call" and report.passed and record.missing_verdicts():
        # The contract: a passing scenario has decided every claim it declares.
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} declares {', '.join(record.claims)} but recorded no verdict for "
            f"{', '.join(record.missing_verdicts())}: call record.verdict(claim, verdict, evidence)"
        )
    elif call.when == "call" and report.passed and (skipped := _self_skipped(record)):
        # A skip decided inside a passing test escapes the capability table (a capability
        # expected here and lost would pass for one missing): skips go through pytest.skip,
        # requires() or DeviceInfo.optional, where the table judges them.
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} passed but recorded 'skipped' for {', '.join(skipped)}: "
            "a verdict of a passing test is decided; to skip, use @pytest.mark.requires, "
            "DeviceInfo.optional or pytest.skip with the reason"
        )
    if report.failed:
        # Name the claims on every failure, with what was measured before it.
        decided = [f"{v.claim}: {v.verdict} ({v.evidence})" for v in record.verdicts.values()]
        report.sections.append(
            ("amp-harness", f"claims: {', '.join(record.claims)}\n" + "\n".join(decided))
        )
        outcome = "failed" if call.when == "call" else "error"
        item.stash[_OUTCOME].append((outcome, _first_line(report)))
    elif report.skipped:
        item.stash[_OUTCOME].append(("skipped", _skip_reason(report)))
    if call.when == "teardown":
        _finish(item, record)
    state = _state(item.config)
    if state.worker_output:  # a worker hands its reports to the parent, which shows them
        hook = item.config.hook
        state.worker_reports.append(
            hook.pytest_report_to_serializable(config=item.config, report=report)
        )
    return report


def _check_torch_state(item: pytest.Item, when: str, report: pytest.TestReport) -> None:
    """A test that leaves torch's global state changed fails, naming each switch, before ->
    after; the state is put back, so that the tests after it measure what they would have.
    The test's body is held to the state its fixtures set up (a fixture may set a dtype for
    it), the whole test, teardown included, to the state before its setup."""
    if when == "setup":
        item.stash[_TORCH_SET_UP] = torch_state.snapshot()
        return
    expected = item.stash.get(_TORCH_SET_UP if when == "call" else _TORCH_BEFORE, None)
    changed = expected and torch_state.changes(expected, torch_state.snapshot())
    if not changed:
        return
    stuck = torch_state.restore(expected)
    text = (
        f"{item.nodeid} left torch's global state changed"
        f"{'' if when == 'call' else ' by a fixture'}: {'; '.join(changed)}. "
        + (f"Not put back: {', '.join(stuck)}; the tests after it run with that. " if stuck
           else "Put back for the tests after it. ")
        + "Fix: change it inside a with-block (torch.autocast(...), torch.no_grad(), ...) or "
        "restore it in a try/finally"
    )  # fmt: skip
    if report.passed:
        report.outcome, report.longrepr = "failed", text
    else:
        report.sections.append(("amp-harness: torch state", text))


def _self_skipped(record: Record) -> list[str]:
    return [v.claim for v in record.verdicts.values() if v.verdict == "skipped"]


def _finish(item: pytest.Item, record: Record) -> None:
    outcomes = item.stash[_OUTCOME]
    record.outcome, record.message = outcomes[0] if outcomes else ("passed", "")
    if _REGRESSION in item.stash:
        record.outcome, record.message = CAPABILITY_REGRESSION, item.stash[_REGRESSION].reason
    if record.outcome == "skipped":
        for claim in record.missing_verdicts():
            record.verdict(claim, "skipped", record.message)
    record.ended = time.time()
    _state(item.config).finish(record)


def _first_line(report: pytest.TestReport) -> str:
    text = report.longreprtext.strip()
    lines = [line for line in text.splitlines() if line.startswith("E ")] or text.splitlines()
    return lines[0].removeprefix("E").strip()[:500] if lines else ""


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    return str(longrepr[2]).removeprefix("Skipped: ") if isinstance(longrepr, tuple) else ""


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    state = _state(config)
    if state.entry is None:
        return
    writer = terminalreporter._tw
    records = state.session_records()
    if records:
        # The terminal's own encoding: pytest escapes a whole text it cannot encode (the table
        # on one line, with literal \n), so the table is made for it.
        encoding = getattr(getattr(writer, "_file", None), "encoding", None)
        terminalreporter.write(for_terminal(
            records, writer.fullwidth, writer.hasmarkup, encoding,
            verbose=config.getoption("verbose") > 0, tty=bool(terminalreporter.isatty()),
        ))  # fmt: skip

    say = terminalreporter.write_line  # one line each: scripts grep `MLflow: ...` whole
    say(f"journal: {state.journal.path}")
    for record in records:
        if warned.FIELD in record.params:
            say(
                f"torch warned in {record.test} (recorded with it, not fatal): "
                + shown.visible(cap(record.params[warned.FIELD], "in its record", 300, 1)),
                yellow=True,
            )
    for message in dict.fromkeys(state.journal_warnings):
        say(f"journal: {message}", yellow=True)
    for message in state.rewrote():
        say(f"journal: {message}", red=True, bold=True)
    if state.journal_down:
        say(f"journal: {state.journal_down}", red=True, bold=True)
    if state.sink is None:
        sync = command_line("sync", reports=state.reports)
        say(f"MLflow: off (--no-mlflow); {sync} sends the journal later")
    elif state.sink.down:
        say(
            f"MLflow: {state.sink.down}; every result is in the journal: {state.sink.recovery()}",
            yellow=True,
        )
    else:
        say(
            f"MLflow: {state.sink.label} (experiment {state.sink.experiment!r}); "
            f"{state.sink.browse()}"
        )
    for refused in state.sink.refused if state.sink else []:
        say(f"MLflow refused {refused}; the result is in the journal", yellow=True)
    for note in state.sink.notes if state.sink else []:
        say(f"MLflow: {note}")
    if state.baseline is not None:
        _write_comparison(terminalreporter, state)


class _LastLines:
    """The session's last lines, after pytest's short test summary (its wrapper's `finally`;
    this one is outermost): the tail of a CI log says the counts, the session's id and where
    its report is."""

    def __init__(self, config: pytest.Config):
        self.config = config

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_terminal_summary(self, terminalreporter):
        try:
            return (yield)
        finally:
            state = _state(self.config)
            if state.entry is not None and not state.shared:
                width = terminalreporter._tw.fullwidth
                for line in _last_lines(state):
                    for wrapped in indented(shown.visible(line), width, "", whole_words=True):
                        terminalreporter.write_line(wrapped)  # paths and commands to copy


def _last_lines(state: AmpSession) -> list[str]:
    """The counts, the session's id and whether it ran the whole suite, how to find and compare
    it, and how its report is made: each command for the folder and the store the session used
    (command_line)."""
    sid = short_id(state.entry["session_id"])
    left_out = state.end["left_out"] if state.end else ["the session did not end"]
    run = f"partial ({'; '.join(left_out)})" if left_out else "the whole suite"
    folder, uri = state.reports, state.sink.uri if state.sink else None
    report = f"{command_line('report', reports=folder, uri=uri)} writes it from MLflow"
    if state.sink is None:
        report = f"{command_line('sync', reports=folder)}, then {report}"
    return [
        counts_line(state.session_records()),
        f"session {sid}: {run}",
        f"sessions: {command_line('sessions', reports=folder)}; compare: "
        f"{command_line('compare', 'ID', sid, reports=folder)}",
        f"report: {report}",
    ]


def _write_comparison(terminalreporter, state: AmpSession) -> None:
    comparison = state.comparison
    if comparison is None:
        terminalreporter.write_line(
            f"amp-harness: {compare.MissingBaseline(state.baseline)}", yellow=True
        )
        legacy = state.baseline.with_name(baseline.legacy_filename(state.entry["fingerprint"]))
        if legacy != state.baseline and legacy.is_file():
            terminalreporter.write_line(
                f"amp-harness: {legacy} was saved before hardware classes: it does not say "
                f"which CPU class it was measured on, so it is never taken as this "
                f"environment's ({environments.hardware_class(state.entry['fingerprint'])}); "
                f"compare with it by hand (--amp-baseline {legacy}) or save one for this class",
                yellow=True,
            )
        return
    facts = state.baseline_summary.get("fingerprint", {})
    terminalreporter.write_line(
        f"baseline {state.baseline}: hardware class {environments.hardware_class(facts)}"
        + (" (saved before hardware classes: a name only)" if environments.is_legacy(facts) else "")
        + f", torch {environments.fact(facts, 'torch')}; this session: "
        f"{environments.hardware_class(state.entry['fingerprint'])}"
    )
    if state.baseline_why:  # another environment's: the gate of an upgrade
        terminalreporter.write_line(f"baseline {state.baseline}: {state.baseline_why}", yellow=True)
    for line in comparison.kind_lines():
        terminalreporter.write_line(f"baseline {state.baseline}: {shown.visible(line)}")
    for note in comparison.accepted_notes:
        terminalreporter.write_line(f"accepted change {shown.visible(note)}", yellow=True)
    if comparison.not_compared:
        terminalreporter.write_line(
            f"baseline {state.baseline}: not compared, this session ran part of the suite "
            f"({'; '.join(comparison.b_lacks)}): {', '.join(comparison.not_compared)}",
            yellow=True,
        )
    failing = state.config.getoption("amp_fail_on_regression") and comparison.fails_the_gate
    if not comparison.regressions and not failing:
        overlapped = comparison.overlapped
        terminalreporter.write_line(
            f"baseline {state.baseline}: {comparison.summary_line()}",
            green=overlapped,
            yellow=not overlapped,
        )
        return
    terminalreporter.write_line(
        f"baseline {state.baseline}: {comparison.summary_line()}"
        + ("; --amp-fail-on-regression fails the session" if failing else ""),
        red=True,
        bold=True,
    )
    for line in comparison.regressions:
        terminalreporter.write_line(f"  {shown.visible(line)}", red=True)  # baseline evidence
    baselines = state.baselines_folder()
    elsewhere = (
        ""
        if baselines == state.config.rootpath / "reports" / "baselines"
        else (f" --baselines {baselines}")
    )
    terminalreporter.write_line(
        f"every change: `amp-harness compare {state.baseline} {state.entry['session_id']} "
        f"--reports {state.reports}{elsewhere}`"
    )


def _keep_worker_records(config: pytest.Config, state: AmpSession) -> None:
    """A pytest-xdist worker's records stay in the journal even if it vanished after the
    worker's last append; its controller says what was written again."""
    said = []
    try:
        state.journal.write_kept()
    except HarnessError as exc:
        said.append(str(exc))
    config.workeroutput["amp_journal_rewritten"] = state.journal.rewritten + said
    # The controller collects nothing: the slow tests its workers left out, for its left_out.
    config.workeroutput["amp_slow_deselected"] = state.slow_deselected


def pytest_sessionfinish(session: pytest.Session) -> None:
    state = _state(session.config)
    if state.saved_threads is not None:
        torch.set_num_threads(state.saved_threads)
    if state.worker_output:
        record = state.records[0].to_dict() if state.records else None
        Path(state.worker_output).write_text(
            json.dumps({"record": record, "reports": state.worker_reports}), encoding="utf-8"
        )
        return
    if state.entry is None:
        return
    if state.current is not None:  # Ctrl-C (or a fatal error) stopped this test midway
        record, state.current = state.current, None
        record.outcome, record.message = "interrupted", f"session ended: {session.exitstatus!r}"
        if stopsignals.received:  # SIGTERM, SIGHUP: taken as Ctrl-C
            record.message += f" (stopped by {stopsignals.received})"
        record.ended = time.time()
        state.finish(record)
    if state.shared:  # a pytest-xdist worker: the controller ends the session
        _keep_worker_records(session.config, state)
        return
    records = state.session_records()  # a pytest-xdist controller reads them from the journal
    end = {"type": "session_end", "session_id": state.entry["session_id"]}
    end["left_out"] = state.left_out({r.test for r in records})
    # Before the session's end is recorded: a regression that fails the session is its status.
    state.compare_with_baseline(end)
    if (
        state.comparison is not None
        and state.comparison.fails_the_gate
        and session.config.getoption("amp_fail_on_regression")
        and session.exitstatus == pytest.ExitCode.OK  # a worse status (interrupted, ...) stays
    ):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    counts: dict[str, int] = {}
    for r in records:
        counts[r.outcome] = counts.get(r.outcome, 0) + 1
    end.update(ended=time.time(), exitstatus=int(session.exitstatus), counts=counts)
    state.end = end  # for the session's last lines (_LastLines)
    try:
        if not state.journal_down:
            state.append(end)
        if state.sink:
            state.sink.end_session(state.entry, end)
    except HarnessError as exc:  # the journal could not take the end: said under the table
        state.journal_down = str(exc)
    finally:
        if state.running:  # from here on, `amp-harness sync` may end its run if need be
            state.running.close()
