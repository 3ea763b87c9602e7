"""tests/xdist_groups.py: under --dist loadgroup, the tests of one xdist_group run on one
worker (the suite's shared servers and once-computed results rely on it)."""

from __future__ import annotations

import re
from collections import defaultdict

import pytest
from conftest import REPO

GROUPED = """
import pytest

@pytest.mark.xdist_group("shared")
@pytest.mark.parametrize("i", range(6))
def test_member(i):
    pass

@pytest.mark.parametrize("i", range(6))
def test_free(i):
    pass
"""


@pytest.mark.slow
def test_a_group_runs_on_one_worker_and_the_others_spread(pytester, monkeypatch):
    pytester.makepyfile(test_grouped=GROUPED)
    monkeypatch.setenv("PYTHONPATH", str(REPO / "tests"))  # where the workers find the plugin
    result = pytester.runpytest_subprocess(
        "-n", "2", "--dist", "loadgroup", "-p", "xdist_groups", "-p", "no:cacheprovider", "-v",
    )  # fmt: skip
    result.assert_outcomes(passed=12)
    workers = defaultdict(set)
    for line in result.outlines:
        if found := re.match(r"\[(gw\d)\].* PASSED test_grouped\.py::(test_\w+)\[", line):
            workers[found[2]].add(found[1])
    assert workers["test_member"] and len(workers["test_member"]) == 1, dict(workers)
    assert len(workers["test_free"]) == 2, dict(workers)  # the control: ungrouped ones spread
