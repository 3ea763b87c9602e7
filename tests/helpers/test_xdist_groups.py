"""tests/helpers/xdist_groups.py: under --dist loadgroup, the tests of one xdist_group run on one
worker (the suite's shared servers and once-computed results rely on it)."""

from __future__ import annotations

import re
from collections import defaultdict

from conftest import REPO

GROUPED = """
import pytest

@pytest.mark.xdist_group("shared")
@pytest.mark.parametrize("i", range(6))
def test_member(i):
    pass
"""


def test_a_group_runs_on_one_worker(pytester, monkeypatch):
    pytester.makepyfile(test_grouped=GROUPED)
    monkeypatch.setenv("PYTHONPATH", str(REPO / "tests"))  # where the workers find the plugin
    result = pytester.runpytest_subprocess(
        "-n", "2", "--dist", "loadgroup", "-p", "helpers.xdist_groups", "-v",
        "-p", "no:amp_harness", "-p", "no:cacheprovider",  # no torch to import: a second
    )  # fmt: skip
    result.assert_outcomes(passed=6)
    # The scheduler groups by the `@group` suffix of a test's id (without it, as under pytest
    # 9.2 with xdist 3.8 alone, the members scatter, or share a worker only by chance).
    members = [line for line in result.outlines if "PASSED test_grouped.py::test_member[" in line]
    assert len(members) == 6 and all(line.rstrip().endswith("@shared") for line in members), members
    workers = defaultdict(set)
    for line in members:
        found = re.match(r"\[(gw\d)\]", line)
        workers[found[1] if found else "?"].add(line)
    assert len(workers) == 1, dict(workers)  # one worker ran the whole group
