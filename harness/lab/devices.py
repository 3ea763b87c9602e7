"""What this machine can do, probed at run time, and held against what this build and hardware
are expected to have: the face scenarios, teams and the plugin import
(`from harness.lab import devices`, `from harness.lab.devices import Capability, Expected,
Probe`). It re-exports; the room is harness/lab/machine/ (its `__init__` names each module).

- `probe(device_type)` / `resolve(choice)`: the probed `DeviceInfo`; `.missing(...)` and
  `.optional(...)` say why it cannot run something (`Lack`), or raise `CapabilityRegression`;
- `Capability`, `Expected`, `Probe`: a team's own capabilities (`scenarios/capabilities.py`,
  loaded by `with_team_capabilities`), in the shape of the built-in rows (`BUILT_IN`);
- the tables made from the built-in rows: `PROBES`, `DEFERRED_PROBES`, `CAPABILITY_TEXT`,
  `EXPECTED`, `NOT_EXPECTED`, `HARDWARE_CAPABILITIES`.
"""

from harness.lab.machine.capabilities import (
    BUILT_IN,
    CAPABILITY_TEXT,
    DEFERRED_PROBES,
    DEVICE_TYPES,
    EXPECTED,
    HARDWARE_CAPABILITIES,
    NOT_EXPECTED,
    PROBES,
    BuiltIn,
    Capability,
    Expected,
)
from harness.lab.machine.device import (
    DEVICE_CHOICES,
    TEAM_CAPABILITIES,
    CapabilityRegression,
    DeviceInfo,
    Lack,
    probe,
    resolve,
)
from harness.lab.machine.probes import Probe, installed_version
from harness.lab.machine.team import DECLARED, known_capabilities, with_team_capabilities

__all__ = [
    "BUILT_IN",
    "CAPABILITY_TEXT",
    "DECLARED",
    "DEFERRED_PROBES",
    "DEVICE_CHOICES",
    "DEVICE_TYPES",
    "EXPECTED",
    "HARDWARE_CAPABILITIES",
    "NOT_EXPECTED",
    "PROBES",
    "TEAM_CAPABILITIES",
    "BuiltIn",
    "Capability",
    "CapabilityRegression",
    "DeviceInfo",
    "Expected",
    "Lack",
    "Probe",
    "installed_version",
    "known_capabilities",
    "probe",
    "resolve",
    "with_team_capabilities",
]
