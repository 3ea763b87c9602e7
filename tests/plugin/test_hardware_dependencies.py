"""What a test's verdicts depend on in the hardware (Record.depends_on_hardware): named by the
scenario, or by the plugin from what the test requires, and carried into the baseline, so that
`compare` and the report can attribute a difference across hardware classes."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_plugin import journal_records, run

from harness.common.errors import HarnessError
from harness.lab import devices
from harness.records.journal import Journal
from harness.records.record import DEPENDS_ON_HARDWARE, Record
from harness.reports import baseline


def test_dependencies_accumulate_once_each_and_unknown_ones_are_refused():
    record = Record("scenarios/test_x.py::test_y", ["FMT-BYTES"], "cpu", Path("/nonexistent"))
    record.depends_on_hardware("bf16_rnn")
    record.depends_on_hardware("class", "bf16_rnn")
    assert record.params[DEPENDS_ON_HARDWARE] == "bf16_rnn,class"
    with pytest.raises(HarnessError, match="'bf16_lstm'.*not a capability.*bf16_rnn"):
        record.depends_on_hardware("bf16_lstm")


SCENARIO = """
import pytest

@pytest.mark.claim("FMT-BYTES")
@pytest.mark.requires({needs})
{marks}
def test_bytes(record):
    record.verdict("FMT-BYTES", "confirmed", "fp16 2 bytes")
"""


@pytest.mark.parametrize(
    ("needs", "marks", "expected"),
    [
        # bf16 autocast follows the hardware on CUDA (sm_80), not on the CPU: no dependency.
        ('"bf16_autocast"', "", None),
        ('"bf16_autocast", "bf16_matmul_kernel"', "", "bf16_matmul_kernel"),
        ('"fp16_autocast"', "@pytest.mark.timing", "class"),
    ],
)
def test_the_plugin_names_what_the_test_requires_that_follows_the_hardware(
    pytester, needs, marks, expected
):
    """Whether the test ran or skipped here (a capability absent on this CPU), its record says
    what it depends on: a skip on one class and a verdict on another is the hardware's doing."""
    result = run(pytester, SCENARIO.format(needs=needs, marks=marks))
    assert result.ret in (0, pytest.ExitCode.OK), result.stdout.str()
    (rec,) = journal_records(pytester)
    assert rec["params"].get(DEPENDS_ON_HARDWARE) == expected, rec["params"]
    summary = baseline.summarize(Journal(pytester.path / "reports" / "journal.jsonl"))
    (entry,) = summary["tests"].values()
    assert entry["depends_on_hardware"] == ([expected] if expected else [])


def test_the_hardware_capabilities_are_the_rows_with_a_hardware_condition():
    """The control of the above: which capabilities count follows the table, per device."""
    assert ("cpu", "bf16_rnn") in devices.HARDWARE_CAPABILITIES
    assert ("cuda", "bf16_autocast") in devices.HARDWARE_CAPABILITIES
    assert ("cpu", "bf16_autocast") not in devices.HARDWARE_CAPABILITIES


TEAM_CAPABILITIES = """
from harness.lab.devices import Capability, Expected, Probe

CAPABILITIES = [
    Capability("team_vector_kernel", "the team's vectorised kernel",
               lambda device_type: Probe(True, "ran"),
               {"cpu": Expected(cpu="sse41", source="its kernel needs SSE4.1")}),
    Capability("team_plain_kernel", "the team's plain kernel",
               lambda device_type: Probe(True, "ran"),
               {"cpu": Expected(source="any CPU runs it")}),
]
"""
TEAM_SCENARIO = """
import pytest

@pytest.mark.claim("FMT-BYTES")
@pytest.mark.requires("team_vector_kernel", "team_plain_kernel")
def test_bytes(record):
    record.depends_on_hardware("team_plain_kernel")  # the scenario may name a team's too
    record.verdict("FMT-BYTES", "confirmed", "fp16 2 bytes")
"""


def test_a_team_capability_that_follows_the_cpu_level_is_a_hardware_dependency(pytester):
    """A team's capability expected from a CPU level (or a compute capability) follows the
    hardware as a built-in one with such a row does; one expected everywhere does not, unless
    the scenario names it."""
    pytester.makepyfile(**{"scenarios/capabilities": TEAM_CAPABILITIES})
    result = run(pytester, TEAM_SCENARIO)
    result.assert_outcomes(passed=1)
    (rec,) = journal_records(pytester)
    assert rec["params"][DEPENDS_ON_HARDWARE] == "team_plain_kernel,team_vector_kernel"
