"""How a scenario test runs: its record made at setup, in its own process where isolated, what
it needs of the device (a lost capability fails it, a missing one skips it), torch's warnings
kept with it, torch's global state held, and each phase's outcome recorded at its teardown."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from harness.catalogue.verdicts import CAPABILITY_REGRESSION
from harness.common import shown
from harness.common.errors import HarnessError
from harness.lab import devices
from harness.plugin.collection import claim_ids
from harness.plugin.session import AmpSession, state_of
from harness.records import environments, fingerprint, isolation, torch_state, warned
from harness.records.record import SCENARIO_DIGEST, Record
from harness.reports.table import cap

RECORD = pytest.StashKey[Record]()
_OUTCOME = pytest.StashKey[list]()  # (outcome, message) per phase that did not pass
_REGRESSION = pytest.StashKey[devices.Lack]()  # a capability expected here, found missing
_TORCH_BEFORE = pytest.StashKey[dict]()  # torch's global state before the test's setup
_TORCH_SET_UP = pytest.StashKey[dict]()  # and once its fixtures are set up


def _new_record(item: pytest.Item, state: AmpSession) -> Record:
    record = Record(
        test=item.nodeid,
        claims=claim_ids(item) or [],
        device=state.device.describe(),
        artifact_dir=state.artifact_dir(item.nodeid),
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


def run_isolated(item: pytest.Item) -> bool | None:
    """An isolated test runs in a worker process; its reports and record come back from there,
    or, if the worker crashed or hung, reports that say so. None: pytest's own protocol runs
    the test, in this process."""
    state = state_of(item.config)
    if not _isolated(item, state):
        return None
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    state.current = _new_record(item, state)
    reports, record = isolation.run(
        item, state.device.type, state.reports, item.config.getoption("amp_timeout")
    )
    for report in reports:
        item.ihook.pytest_runtest_logreport(report=report)
    if record is None:  # the worker died
        state.crashed(state.current, _first_line(reports[1]))
    else:
        record.ended = time.time()
        state.finish(record)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def hand_back(state: AmpSession) -> None:
    """An isolated test's worker process: its record and reports, for the parent to show."""
    record = state.records[0].to_dict() if state.records else None
    Path(state.worker_output).write_text(
        json.dumps({"record": record, "reports": state.worker_reports}), encoding="utf-8"
    )


def set_up(item: pytest.Item) -> None:
    state = state_of(item.config)
    if not state.is_scenario(item.path):
        return
    item.stash[RECORD] = record = state.current = _new_record(item, state)
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


def around_call(item: pytest.Item):
    """Around the test's call (a hook wrapper's generator): torch's warnings during a scenario
    are kept with its record, not made errors (harness.records.warned says why and which
    warnings count as torch's)."""
    if RECORD not in item.stash:
        return (yield)
    kept: list[str] = []
    try:
        with warned.torch_warnings_kept() as kept:
            return (yield)
    finally:
        if kept:
            _keep_torch_warnings(item.stash[RECORD], kept)


def _keep_torch_warnings(record: Record, kept: list[str]) -> None:
    """In the record, in fields of their own: a count (the metric) and the messages (the
    param), never in a verdict's evidence, which says what the scenario measured."""
    record.metric(**{warned.FIELD: len(kept)})
    record.param(**{warned.FIELD: cap(" | ".join(kept), "left out", chars=warned.PARAM_CHARS)})


def judge(item: pytest.Item, call: pytest.CallInfo, report: pytest.TestReport) -> None:
    """A phase's report, as the contract and torch's state see it, its outcome noted for the
    record; the record finished at teardown."""
    if RECORD not in item.stash:
        return
    record = item.stash[RECORD]
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
    state = state_of(item.config)
    if state.worker_output:  # a worker hands its reports to the parent, which shows them
        hook = item.config.hook
        state.worker_reports.append(
            hook.pytest_report_to_serializable(config=item.config, report=report)
        )


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
    state_of(item.config).finish(record)


def _first_line(report: pytest.TestReport) -> str:
    text = report.longreprtext.strip()
    lines = [line for line in text.splitlines() if line.startswith("E ")] or text.splitlines()
    return lines[0].removeprefix("E").strip()[:500] if lines else ""


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    return str(longrepr[2]).removeprefix("Skipped: ") if isinstance(longrepr, tuple) else ""
