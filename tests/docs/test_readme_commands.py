"""The README's quick start is what a new user runs and what CI must run: its test command is in
.ci/run verbatim, and so is the command that runs the tests it leaves out (the quick tier's last
line names it, tests/helpers/slow_left_out.py), so that no test is run by neither."""

from __future__ import annotations

import re

from conftest import REPO
from helpers.slow_left_out import RUN_THEM

QUICK_START = re.compile(r"## Quick start\n.*?```bash\n(.*?)```", re.DOTALL)


def quick_start() -> list[str]:
    found = QUICK_START.search((REPO / "README.md").read_text(encoding="utf-8"))
    assert found, "README.md has no ```bash block under ## Quick start"
    return found[1].strip().splitlines()


def ci_commands() -> list[str]:
    lines = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_the_quick_start_has_two_commands_and_ci_runs_its_tests_verbatim():
    commands = quick_start()
    assert len(commands) == 2, commands
    assert commands[1] in ci_commands(), f".ci/run does not run the README's `{commands[1]}`"


def test_ci_runs_the_tests_the_quick_tier_leaves_out():
    assert '-m "not slow"' in quick_start()[1]
    assert any(line.endswith(RUN_THEM.removeprefix("pytest ")) for line in ci_commands()), (
        f".ci/run does not run `{RUN_THEM}`, which the README's test command leaves out"
    )
