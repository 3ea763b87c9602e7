"""pytest-xdist: the controller opens the session and hands it to its workers (and each its GPU
with --amp-gpu-per-worker), learns what they collected, records a test whose worker died, and
hears what a worker wrote again of a journal that vanished."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from harness.catalogue.scenario_source import claimed_tests
from harness.common.errors import HarnessError
from harness.plugin import process
from harness.plugin.session import AmpSession, state_of, xdist_controller
from harness.records import isolation
from harness.records.record import Record


def start(session: pytest.Session) -> None:
    """Under pytest-xdist the controller opens the session (and creates the SQLite store:
    workers creating it at once would corrupt it); the workers record into it."""
    state = state_of(session.config)
    if xdist_controller(session.config) and process.runs_scenarios(session.config, state.scenarios):
        try:
            state.open_tracking()
        except HarnessError as exc:
            raise pytest.UsageError(str(exc)) from None
        session.config.pluginmanager.register(_Controller(state), "amp-harness-controller")


class _Controller:
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
        state.crashed(record, report.longrepr)

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
    declared = claimed_tests(path.parent) or {}
    claims = [claim for claim, tests in declared.items() if test in map(_from_the_root, tests)]
    return Record(nodeid, claims, state.device.describe(), state.artifact_dir(nodeid))


def _from_the_root(test: str) -> str:
    """A test as claimed_tests names it (its file from the current folder), its file from the
    root of the file system."""
    where, _, name = test.partition("::")
    return f"{(Path.cwd() / where).resolve()}::{name}"


def configure_node(node) -> None:
    """What each worker needs from the controller."""
    state = state_of(node.config)
    if state.entry is not None:
        node.workerinput["amp_session"] = state.entry
        node.workerinput["amp_parent_run"] = state.sink.parent_run_id(state.entry) if (
            state.sink and not state.sink.down) else None  # fmt: skip
    if node.config.getoption("amp_gpu_per_worker"):
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        count = torch.cuda.device_count()
        node.workerinput["amp_gpus"] = visible.split(",") if visible else [
            str(i) for i in range(count)]  # fmt: skip


def node_collected(node, ids: list[str]) -> None:
    """The controller learns what its workers collected (it collects nothing)."""
    state = state_of(node.config)
    state.selected |= {i for i in ids if state.is_scenario(node.config.rootpath / i.split("::")[0])}


def keep_worker_records(config: pytest.Config, state: AmpSession) -> None:
    """A pytest-xdist worker's records stay in the journal even if it vanished after the
    worker's last append; its controller says what was written again."""
    said = []
    try:
        state.journal.write_kept()
    except HarnessError as exc:
        said.append(str(exc))
    config.workeroutput["amp_journal_rewritten"] = state.journal.rewritten + said
    if state.sink:  # its results in MLflow before the worker ends (the controller ends the run)
        state.sink.close()
    # The controller collects nothing: the slow tests its workers left out, for its left_out.
    config.workeroutput["amp_slow_deselected"] = state.slow_deselected
