"""A team's probe runs bounded (harness.lab.machine.team): a probe that hangs, exits, returns
what is not a bool, or leaves torch's global state changed is said in one line naming the
capability and the fix (or judged as a probe that said no), and the session goes on or stops
before it records anything; never a hung session, an INTERNALERROR or a silently changed suite.
Issue 55, faults 1 to 4. The control, a probe that answers, is
tests/lab/machine/test_team_capabilities.py's "present" case."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from harness.common.errors import HarnessError
from harness.lab.machine import team
from harness.lab.machine.capabilities import Capability, Expected
from harness.lab.machine.probes import Probe
from harness.records import torch_state

SCENARIO = """
import pytest
import torch

@pytest.mark.claim("FMT-BYTES")
@pytest.mark.requires("team_tool")
def test_needs_the_tool(record):
    record.verdict("FMT-BYTES", "confirmed", f"{torch.get_default_dtype()} default, 2 bytes")
"""
EXPECTED_ON_CPU = "{'cpu': Expected(source='the team installs it on every CPU runner')}"


def declared(body: str) -> str:
    return "import sys, time\nimport torch\n" + textwrap.dedent(f"""
        from harness.lab.devices import Capability, Expected, Probe

        def probe(device):
            {body}

        CAPABILITIES = [Capability("team_tool", "the team's tool", probe,
                                   expected={EXPECTED_ON_CPU})]
    """)


def run(pytester: pytest.Pytester, body: str) -> pytest.RunResult:
    pytester.makepyfile(**{"scenarios/test_team": SCENARIO})
    (pytester.path / "scenarios" / "capabilities.py").write_text(declared(body))
    return pytester.runpytest_inprocess(
        "scenarios", "--no-mlflow", "--amp-device=cpu", "--amp-isolate=none",
        "-p", "no:cacheprovider", f"--amp-reports={pytester.path / 'reports'}", "-rs",
    )  # fmt: skip


def journal_types(pytester: pytest.Pytester) -> list[str]:
    import json

    path = pytester.path / "reports" / "journal.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line)["type"] for line in lines]


def test_a_probe_that_hangs_is_stopped_at_the_limit_and_the_session_records(pytester, monkeypatch):
    monkeypatch.setattr(team, "PROBE_LIMIT_S", 0.5)
    # A hang never returns: that the run returns, saying the limit stopped it, is the check.
    result = run(pytester, "time.sleep(10**6)")
    result.assert_outcomes(errors=1)  # expected on the CPU, and no answer: a regression
    result.stdout.fnmatch_lines(["*the team's tool*it did not answer within 0.5 s*"])
    assert journal_types(pytester) == ["session", "record", "session_end"]


def test_a_probe_that_exits_said_no_and_is_no_internal_error(pytester):
    result = run(pytester, "sys.exit(3)")
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*the team's tool*it raised SystemExit(3)*rather than exiting*"])
    assert journal_types(pytester) == ["session", "record", "session_end"]


@pytest.mark.parametrize(
    ("returned", "error"),
    [
        ("Probe('no', 'the tool said no')",
         "*Capability('team_tool'): probe('cpu') returned Probe(works='no'): works is a bool*"
         "'no' would read as true*"),
        ("Probe(torch.tensor(True), 'a tensor')", "*Probe(works=tensor(True)): works is a bool*"),
        ("Probe(True, 42)", "*returned Probe(saw=42): saw is a str, what the probe saw in words*"),
    ],
    ids=["works-a-string", "works-a-tensor", "saw-a-number"],
)  # fmt: skip
def test_a_probe_result_of_the_wrong_type_stops_the_session_before_it_records(
    pytester, returned, error
):
    result = run(pytester, f"return {returned}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: *capabilities.py: {error}".replace("[", "[[]")])
    assert "test_needs_the_tool" not in result.stdout.str()  # it never ran
    assert journal_types(pytester) == []


def test_a_probe_that_changes_global_state_is_named_and_put_back(pytester):
    dtype = torch.get_default_dtype()
    result = run(pytester, "torch.set_default_dtype(torch.float64); return Probe(True, 'ran')")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "ERROR: *capabilities.py: Capability('team_tool'): probe('cpu') left torch's global "
        "state changed: torch.default_dtype: torch.float32 -> torch.float64 (put back). Fix:*"
    ])  # fmt: skip
    assert torch.get_default_dtype() == dtype
    assert journal_types(pytester) == []


def test_the_time_limit_puts_back_a_timer_set_before_it():
    """pytest-timeout's signal method arms SIGALRM too: the probe's limit must leave it armed."""
    previous = signal.signal(signal.SIGALRM, lambda *_: None)
    signal.setitimer(signal.ITIMER_REAL, 100.0)
    try:
        with team._time_limit(5.0):
            pass
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 90 < left <= 100
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_the_guard_is_the_tests_guard_and_names_what_leaked():
    def leaks(device: str) -> Probe:
        torch.set_flush_denormal(True)
        return Probe(True, "ran")

    tool = Capability("team_tool", "the team's tool", leaks, {"cpu": Expected(source="s")})
    before = torch_state.snapshot()
    with pytest.raises(HarnessError, match=r"torch.flush_denormal: False -> True \(put back\)"):
        team._probe_team(tool, "cpu", torch_state.kept)
    assert torch_state.snapshot() == before
    # Sensitivity: without the guard, the leak would reach every test after the probes.
    seen = team._probe_team(tool, "cpu", lambda _name: __import__("contextlib").nullcontext())
    try:
        assert seen.works and torch_state.changes(before, torch_state.snapshot())
    finally:
        torch_state.restore(before)


@pytest.mark.slow
def test_sigterm_during_a_probe_stops_the_session_in_one_line(tmp_path):
    """SIGTERM is Ctrl-C in a session (harness.records.stopsignals): during a probe that hangs it
    printed nothing and wrote no journal; now one line names the probe. A process of its own:
    the signal is the real one."""
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "test_team.py").write_text(SCENARIO)
    marker = tmp_path / "probing"
    (tmp_path / "scenarios" / "capabilities.py").write_text(
        declared(f"open({str(marker)!r}, 'w').close(); time.sleep(10**6)")
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    child = subprocess.Popen(
        [sys.executable, "-m", "pytest", "scenarios", "--no-mlflow", "--amp-device=cpu",
         "-p", "no:cacheprovider", f"--amp-reports={tmp_path / 'reports'}"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not marker.exists():
        time.sleep(0.2)
    child.send_signal(signal.SIGTERM)
    out, err = child.communicate(timeout=60)
    assert child.returncode == pytest.ExitCode.USAGE_ERROR, out + err
    assert "Capability('team_tool'): probe('cpu'): interrupted (Stopped SIGTERM)" in err
    assert "Traceback" not in out + err
