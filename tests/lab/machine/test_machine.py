"""harness/lab/machine/: a built-in capability is one row (its probe, its words, its expectations,
deferred or not), and the tables the harness reads are made from the rows; the faces
(harness.lab.devices, harness.lab.hardware) keep every name scenarios, teams, the docs and the
plugin import from them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO

from harness.common.errors import HarnessError
from harness.lab import devices, hardware
from harness.lab.machine import capabilities
from harness.lab.machine.capabilities import BUILT_IN, BuiltIn, Capability, Expected
from harness.lab.machine.probes import Probe


def _works(_device: str) -> Probe:
    return Probe(True, "ran")


def test_each_table_is_made_from_the_rows():
    names = [row.name for row in BUILT_IN]
    assert len(names) == len(set(names))
    assert set(capabilities.PROBES).isdisjoint(capabilities.DEFERRED_PROBES)
    assert {*capabilities.PROBES, *capabilities.DEFERRED_PROBES} == set(names)
    assert list(capabilities.CAPABILITY_TEXT) == ["cuda", *names]  # cuda: the device itself
    for row in BUILT_IN:
        probes = capabilities.DEFERRED_PROBES if row.deferred else capabilities.PROBES
        assert probes[row.name] is row.probe
        assert capabilities.CAPABILITY_TEXT[row.name] == row.text
        for device_type, expected in row.expected.items():
            assert capabilities.EXPECTED[device_type, row.name] is expected
        for device_type, why in row.not_expected.items():
            assert capabilities.NOT_EXPECTED[device_type, row.name] == why
    rows = sum(len(row.expected) for row in BUILT_IN)
    assert len(capabilities.EXPECTED) == rows


def test_a_built_in_row_is_held_to_a_team_s_rules_but_its_name():
    row = BuiltIn("gloo", "gloo again", _works, {"cpu": Expected(source="why")})
    assert row.name == "gloo"  # a built-in row names a built-in capability
    with pytest.raises(HarnessError, match="'gloo' is a built-in capability"):
        Capability("gloo", "gloo again", _works, {"cpu": Expected(source="why")})
    # Negative controls: a row is checked as a team's declaration is.
    with pytest.raises(HarnessError, match=r"expected\['gpu'\]: the device types are cpu, cuda"):
        BuiltIn("new_one", "a new one", _works, {"gpu": Expected(source="why")})
    with pytest.raises(HarnessError, match=r"not_expected\['cpu'\]"):
        BuiltIn("new_one", "a new one", _works, {"cpu": Expected(source="why")},
                not_expected={"cpu": "and why not"})  # fmt: skip


def _used(pattern: str, paths: list[Path]) -> set[str]:
    return {name for path in paths for name in re.findall(pattern, path.read_text())}


def test_the_faces_keep_what_scenarios_teams_and_the_plugin_import():
    harness = REPO / "harness"
    faces = [
        *(harness / "plugin").rglob("*.py"),
        *(harness / "cli").rglob("*.py"),
        *harness.glob("plugin.py"),
        *harness.glob("cli.py"),
    ]
    readers = [
        *(REPO / "scenarios").glob("*.py"),
        REPO / "tests" / "helpers" / "team_guide.py",
        *(REPO / "docs").glob("*.md"),
        *faces,
    ]
    used = _used(r"\bdevices\.([A-Za-z_]\w*)", readers) - {"py"}  # "devices.py" in prose
    used |= _used(r"from harness\.lab\.devices import ([\w, ]+)", readers)
    named = {name.strip() for names in used for name in names.split(",")}
    assert {"Capability", "Expected", "Probe", "probe"} <= named  # the scan reads them
    assert not [name for name in sorted(named) if not hasattr(devices, name)]
    held = _used(r"\bhardware\.([A-Za-z_]\w*)", faces)
    assert held and not [name for name in sorted(held) if not hasattr(hardware, name)]
