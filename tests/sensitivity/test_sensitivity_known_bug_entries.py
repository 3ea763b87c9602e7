"""Each entry of the known-bug ledger, its own reproduction shown able to fail both ways:

- the bug patched out (the reproduction's buggy path runs its control's code, where the bug
  cannot occur): the verdict is a contradiction, "absent where the ledger predicts present";
- the bug forced into the control (the control runs the buggy path): the verdict is "the control
  shows the harm too".

Each row runs the entry's real reproduction once each way, as scenarios/test_known_bugs.py does,
and judges the swapped pair with the same function the scenario asserts on (Record.known_bug), so
a harm check that always or never fires, or a control that is not the one difference, fails here
by name. test_sensitivity_known_bugs.py shows the scenario turns each judgement into a failure.

A bug can only be shown where it is: an entry the ledger says this release does not have skips
with the release to run this on (`/path/to/venv-of-that-release/bin/pytest` this file); that its
harm and clean control were measured there is held from the committed baselines by
tests/catalogue/test_known_bug_ledger.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.catalogue import known_bugs as ledger_entries
from harness.catalogue.claims import ledger
from harness.lab import known_bugs
from harness.records.record import Record
from harness.records.warned import torch_warnings_kept

pytestmark = pytest.mark.slow  # every reproduction twice, the compiled ones compiling


def _rows():
    for bug, reproduction in sorted(known_bugs.REPRODUCTIONS.items()):
        if "cpu" in reproduction.devices:
            yield pytest.param(reproduction, id=bug)


def _judged(bug: str, seen: known_bugs.Observed, control: known_bugs.Observed) -> str | None:
    record = Record(f"scenarios/test_known_bugs.py::test_known_bug[{bug}]", [bug], "cpu", Path())
    return record.known_bug(
        bug,
        present=seen.harm,
        control_clean=not control.harm,
        evidence=f"{seen.says}; {control.says}",
    )


@pytest.mark.parametrize("reproduction", list(_rows()))
def test_each_reproduction_fails_with_its_bug_patched_out_or_forced_into_its_control(reproduction):
    bug = reproduction.bug
    entry = ledger()[bug]
    predicted = entry.predicted(torch.__version__)
    if predicted != ledger_entries.PRESENT:
        pytest.skip(
            f"{bug}: {predicted} on torch {torch.__version__}; its harm shows on {entry.affects}: "
            f"run this file under one of those releases"
        )
    device = torch.device("cpu")
    with torch_warnings_kept():  # as in a scenario: torch's warnings are kept, not errors
        buggy, clean = reproduction.run(device, False), reproduction.run(device, True)

    patched_out = _judged(bug, clean, clean)
    assert patched_out is not None and "where the ledger predicts present" in patched_out, (
        f"{bug}: with its buggy path running the control's code the verdict should contradict "
        f"the ledger; it was {patched_out!r}"
    )
    forced_in = _judged(bug, buggy, buggy)
    assert forced_in is not None and "the control shows the harm too" in forced_in, (
        f"{bug}: with its control running the buggy path the verdict should name the control; "
        f"it was {forced_in!r}"
    )
