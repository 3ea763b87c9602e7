"""The pytest face of the harness, registered through the `pytest11` entry point.

pytest registers this module, so every hook is here; each hands off in a line or two to the
module of its concern:

- `options`: the command-line options (--amp-device, --amp-reports, ...), ini keys and markers;
- `session`: `AmpSession`, in config.stash: device, journal, MLflow, records; how it opens, ends;
- `process`: this process set up before any test (GPU pin, CPU class, device, inductor's cache);
- `collection`: the claim contract checked at collection; what was selected and deselected;
- `protocol`: one scenario test's run: its record, isolation, requires(), torch's state, warnings;
- `fixtures`: `amp_device` (the probed device) and `record` (what the test observed);
- `xdist`: pytest-xdist's controller: the session handed to workers, a dead worker's test recorded;
- `summary`: the verdict table, where the records went, and the session's last lines;
- `gate`: the comparison with a baseline at the end (--amp-baseline, --amp-fail-on-regression).
"""

from __future__ import annotations

import pytest

from harness.plugin import collection, options, process, protocol, summary, xdist
from harness.plugin.fixtures import amp_device, record
from harness.plugin.session import QUICK_TIER, STATE, session_id, state_of

# pytest finds the fixtures among this module's names; `amp-harness` imports the other two.
__all__ = ["QUICK_TIER", "amp_device", "record", "session_id"]


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add(parser)


def pytest_configure(config: pytest.Config) -> None:
    options.add_markers(config)
    config.stash[STATE] = process.set_up(config)
    config.pluginmanager.register(summary.LastLines(config), "amp-harness-last-lines")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist starts its workers
def pytest_sessionstart(session: pytest.Session) -> None:
    xdist.start(session)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    xdist.configure_node(node)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    report = yield
    collection.check(collector, report)
    return report


def pytest_deselected(items: list[pytest.Item]) -> None:
    collection.deselected(items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    xdist.node_collected(node, ids)


def pytest_collection_finish(session: pytest.Session) -> None:
    collection.finished(session)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    return protocol.run_isolated(item)


@pytest.hookimpl(tryfirst=True)  # before pytest's own skipping plugin reads the skip marks
def pytest_runtest_setup(item: pytest.Item) -> None:
    protocol.set_up(item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    return (yield from protocol.around_call(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    protocol.judge(item, call, report)
    return report


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    summary.write(terminalreporter, config)


def pytest_sessionfinish(session: pytest.Session) -> None:
    state = state_of(session.config)
    process.release_threads(state)
    if state.worker_output:
        protocol.hand_back(state)
    elif state.entry is not None:
        state.interrupted(session.exitstatus)
        if state.shared:  # a pytest-xdist worker: the controller ends the session
            xdist.keep_worker_records(session.config, state)
        else:
            state.record_end(session)
