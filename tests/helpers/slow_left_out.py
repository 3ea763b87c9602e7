"""A pytest plugin of the tests: a session that leaves out the tests marked slow says so last.

The README's test command is the quick tier, `pytest tests/ -n 2 --dist loadgroup -m "not slow"`,
and CI runs the rest (`-m slow`). Under xdist the controller collects nothing, and pytest's own
"N deselected" is counted where the tests were collected, on the workers: the session ended on
"1116 passed, 8 skipped" with no word of the 196 tests it had not run. Each worker sends what
it left out to the controller (xdist's workeroutput), which says it in the summary with the
command that runs them. tests/helpers/test_slow_left_out.py holds it.
"""

from __future__ import annotations

import pytest

LEFT_OUT = pytest.StashKey[int]()
WORKER_KEY = "tests_slow_left_out"
RUN_THEM = "pytest tests/ -n 2 --dist loadgroup -m slow"


def pytest_deselected(items: list[pytest.Item]) -> None:
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        stash = slow[0].config.stash
        stash[LEFT_OUT] = stash.get(LEFT_OUT, 0) + len(slow)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workeroutput"):  # an xdist worker: its controller says it
        session.config.workeroutput[WORKER_KEY] = session.config.stash.get(LEFT_OUT, 0)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: absent where xdist is not installed
def pytest_testnodedown(node, error) -> None:
    # Every worker collects the whole suite and deselects the same tests: one worker's count.
    sent = getattr(node, "workeroutput", {}).get(WORKER_KEY, 0)
    stash = node.config.stash
    stash[LEFT_OUT] = max(stash.get(LEFT_OUT, 0), sent)


@pytest.hookimpl(wrapper=True, tryfirst=True)  # outermost: after pytest's short test summary
def pytest_terminal_summary(terminalreporter, config: pytest.Config):
    try:
        return (yield)
    finally:
        left_out = config.stash.get(LEFT_OUT, 0)
        if left_out and not hasattr(config, "workeroutput"):
            terminalreporter.write_line(
                f"{left_out} test(s) marked slow left out (a real server, a process of their "
                f"own, a scenario run, a benchmark at its stated scale): CI runs them; "
                f"`{RUN_THEM}` runs them here"
            )
