"""A team's own capabilities (harness.lab.devices.Capability, declared in the scenario folder's
capabilities.py): judged by the rules of the built-in ones, and a declaration that cannot be
used stops the session naming the file, the line or entry, the field and the fix."""

from __future__ import annotations

import textwrap

import pytest

from harness.common.errors import HarnessError
from harness.lab import devices
from harness.lab.devices import Capability, DeviceInfo, Expected, Probe

HEADER = "from harness.lab.devices import Capability, Expected, Probe\n"
SCENARIO = """
import pytest

@pytest.mark.claim("FMT-BYTES")
@pytest.mark.requires("team_tool")
def test_needs_the_tool(record):
    record.verdict("FMT-BYTES", "confirmed", "2 bytes per fp16 value")
"""


def declared(probe: str, expected: str) -> str:
    return HEADER + textwrap.dedent(f"""
        def probe(device):
            {probe}

        CAPABILITIES = [Capability("team_tool", "the team's tool", probe, expected={expected})]
    """)


def run(pytester: pytest.Pytester, capabilities: str) -> pytest.RunResult:
    devices.probe("cpu")
    pytester.makepyfile(**{"scenarios/test_team": SCENARIO})
    (pytester.path / "scenarios" / "capabilities.py").write_text(capabilities)
    return pytester.runpytest_inprocess(
        "scenarios", "--no-mlflow", "--amp-device=cpu", "--amp-isolate=none",
        "-p", "no:cacheprovider", f"--amp-reports={pytester.path / 'reports'}", "-rs",
    )  # fmt: skip


WORKS = "return Probe(True, 'the tool answered 42')"
FAILS = "return Probe(False, 'the tool answered 0')"
RAISES = "raise RuntimeError('the tool crashed with code 3')"
ON_CPU = "{'cpu': Expected(source='the team installs it on every CPU runner')}"
ON_CUDA = "{'cuda': Expected(source='the GPU image ships it')}"


@pytest.mark.parametrize(
    ("probe", "expected", "outcome", "line"),
    [
        (WORKS, ON_CPU, {"passed": 1}, None),
        (FAILS, ON_CPU, {"errors": 1},
         "*capability regression: the team's tool is expected on cpu*as the team installs it "
         "on every CPU runner; but the probe says no: the tool answered 0*FMT-BYTES*"),
        (RAISES, ON_CPU, {"errors": 1},
         "*capability regression: the team's tool*the probe raised: it raised RuntimeError: the "
         "tool crashed with code 3*"),
        (FAILS, ON_CUDA, {"skipped": 1},
         "SKIPPED*needs the team's tool: not expected on cpu*(the tool answered 0)*"),
        (FAILS, "{}", {"skipped": 1}, "SKIPPED*needs the team's tool: not expected on cpu*"),
    ],
    ids=["present", "lost-is-a-regression", "raised-is-a-regression", "expected-elsewhere-skips",
         "expected-nowhere-skips"],
)  # fmt: skip
def test_a_team_capability_is_judged_as_a_built_in_one(pytester, probe, expected, outcome, line):
    result = run(pytester, declared(probe, expected))
    result.assert_outcomes(**outcome)
    if line:
        result.stdout.fnmatch_lines([line])


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (HEADER + "CAPABILITIES = [Capability('fp16_autocast', 'x', lambda d: None)]",
         "*capabilities.py: line 2: Capability('fp16_autocast'): name: 'fp16_autocast' is a "
         "built-in capability*give yours another name*"),
        (HEADER + "CAPABILITIES = [Capability('tool', 'x', lambda d: None,\n"
         "    expected={'gpu': Expected(source='y')})]",
         "*capabilities.py: line 2: Capability('tool'): expected['gpu']: the device types are "
         "cpu, cuda*"),
        (HEADER + "CAPABILITIES = [Capability('tool', 'x', lambda d: None,\n"
         "    expected={'cpu': Expected()})]",
         "*line 2: Capability('tool'): expected['cpu']=*use Expected(source=*"),
        (HEADER + "CAPABILITIES = [Capability('Team Tool', 'x', lambda d: None)]",
         "*Capability('Team Tool'): name: use lower case letters*"),
        (HEADER, "*capabilities.py: CAPABILITIES is None: declare CAPABILITIES = [Capability(*"),
        (HEADER + "CAPABILITIES = ['tool']",
         "*capabilities.py: CAPABILITIES[0] is 'tool': declare CAPABILITIES = *"),
        (HEADER + "t = Capability('tool', 'x', lambda d: Probe(True, 'y'))\nCAPABILITIES = [t, t]",
         "*capabilities.py: CAPABILITIES[0]: 'tool' is declared twice: keep one*"),
        (HEADER + "CAPABILITIES = [Capability('tool', 'x', lambda d: True)]",
         "*capabilities.py: Capability('tool'): probe('cpu') returned True: return Probe(works, "
         "saw)*"),
        (HEADER + "import team_tool_that_is_not_installed\n",
         "*capabilities.py: line 2: importing it raised ModuleNotFoundError*Fix the file*"),
        # Issue 55: a row's fields held when built, not when first compared (a TypeError).
        (HEADER + "CAPABILITIES = [Capability('tool', 'x', lambda d: None,\n"
         "    expected={'cpu': Expected(torch='2.9', source='y')})]",
         "*line 3: Expected(source='y'): torch='2.9': use two whole numbers, (major, minor), e.g. "
         "torch=(2, 9)"),
        (HEADER + "CAPABILITIES = [Capability('tool', 'x', lambda d: None,\n"
         "    expected={'cpu': Expected(cpu='avx9000', source='y')})]",
         "*line 3: Expected(source='y'): cpu='avx9000': use a CPU level, one of sse41, *"),
    ],
    ids=["built-in-name", "device-type", "no-source", "bad-name", "no-list", "not-a-capability",
         "twice", "probe-returns-a-bool", "import-error", "expected-torch-text",
         "expected-cpu-level"],
)  # fmt: skip
def test_a_declaration_that_cannot_be_used_stops_the_session_naming_file_and_fix(
    pytester, text, error
):
    result = run(pytester, text)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {error}".replace("[", "[[]")])  # [ is fnmatch's


def test_without_a_capabilities_file_the_device_is_as_probed(tmp_path):
    cpu = devices.probe("cpu")
    assert devices.with_team_capabilities(cpu, tmp_path / "capabilities.py") is cpu


def test_an_unknown_capability_names_the_teams_too():
    tool = Capability("team_tool", "the team's tool", lambda d: Probe(True, "ran"))
    cpu = DeviceInfo("cpu", "cpu", 0, None, {"team_tool": Probe(True, "ran")}, team={
        "team_tool": tool})  # fmt: skip
    assert cpu.missing("team_tool") is None
    with pytest.raises(HarnessError, match=r"unknown capability 'team_tol'.*closest: team_tool"):
        cpu.missing("team_tol")


def test_a_cuda_row_follows_the_compute_capability():
    """A team's row with cc=(8, 0): an absence below sm_80 is a skip, above it a regression."""
    tool = Capability("team_tool", "the team's tool", lambda d: Probe(False, "no"),
                      expected={"cuda": Expected(cc=(8, 0), source="from Ampere on")})  # fmt: skip
    seen = {"team_tool": Probe(False, "it answered no")}
    old = DeviceInfo("cuda", "V100", 1, (7, 0), seen, team={"team_tool": tool})
    new = DeviceInfo("cuda", "H200", 1, (9, 0), seen, team={"team_tool": tool})
    assert not old.missing("team_tool").regression
    assert "older than compute capability 8.0" in old.missing("team_tool").reason
    assert new.missing("team_tool").regression
