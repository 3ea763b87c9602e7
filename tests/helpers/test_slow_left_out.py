"""tests/helpers/slow_left_out.py: a session that leaves out the tests marked slow says how many and
the command that runs them, under xdist too, where pytest itself says nothing of them."""

from __future__ import annotations

import pytest
from conftest import REPO

TIERED = """
import pytest

@pytest.mark.slow
@pytest.mark.parametrize("i", range(3))
def test_slow(i):
    pass

def test_quick():
    pass

def test_skipped():
    pytest.skip("a reason")
"""
SAID = (
    "3 test(s) marked slow left out (*): CI runs them; "
    "`pytest tests/ -n 2 --dist loadgroup -m slow` runs them here"
)


@pytest.mark.slow  # processes of their own
@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["one process", "xdist"])
def test_the_quick_tier_names_the_slow_tests_it_left_out(pytester, monkeypatch, workers):
    pytester.makepyfile(test_tiered=TIERED)
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow")
    monkeypatch.setenv("PYTHONPATH", str(REPO / "tests"))  # where the workers find the plugin
    quiet = ("-rs", "-p", "helpers.slow_left_out", "-p", "no:amp_harness", "-p", "no:cacheprovider")
    quick = pytester.runpytest_subprocess(*workers, "-m", "not slow", *quiet)
    quick.assert_outcomes(passed=1, skipped=1)
    quick.stdout.fnmatch_lines(["*short test summary info*", "SKIPPED*a reason", SAID])  # in order
    whole = pytester.runpytest_subprocess(*workers, *quiet)
    whole.assert_outcomes(passed=4, skipped=1)
    assert "left out" not in whole.stdout.str()
    slow = pytester.runpytest_subprocess(*workers, "-m", "slow", *quiet)  # the quick ones are not
    slow.assert_outcomes(passed=3)
    assert "left out" not in slow.stdout.str()
