"""A team's own capabilities, declared beside its scenarios (`scenarios/capabilities.py`, the
list CAPABILITIES of `Capability(name, text, probe, expected)`, harness.lab.machine.capabilities):
loaded by the plugin with `with_team_capabilities`, probed once, and held to the rules of the
built-in ones (docs/writing-a-scenario.md).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import traceback
from pathlib import Path

from harness.common.errors import HarnessError
from harness.lab.machine.capabilities import CAPABILITY_TEXT, Capability
from harness.lab.machine.device import DeviceInfo
from harness.lab.machine.probes import Probe, run_probe


def with_team_capabilities(device: DeviceInfo, path: Path) -> DeviceInfo:
    """`device` with the capabilities declared in `path` (a team's capabilities.py, its list
    CAPABILITIES), each probed now, once, as the built-in ones are; `device` as it is where
    there is no such file. A declaration that cannot be used is a HarnessError naming the file,
    the entry and the fix."""
    if not path.is_file():
        return device
    try:
        declared = _load_capabilities(path)
        probed = {c.name: _probe_team(c, device.type) for c in declared}
    except HarnessError as exc:
        raise HarnessError(f"{path}: {exc}") from None
    DECLARED.update({c.name: c.text for c in declared})
    return dataclasses.replace(
        device,
        capabilities={**device.capabilities, **probed},
        team={c.name: c for c in declared},
    )


# The team capabilities this process has loaded, name -> text: names a record may give
# `depends_on_hardware` beside the built-in ones (it has no DeviceInfo to ask).
DECLARED: dict[str, str] = {}


def known_capabilities() -> dict[str, str]:
    """Every capability name a scenario may name here, built-in or its team's, with its text."""
    return {**CAPABILITY_TEXT, **DECLARED}


def _load_capabilities(path: Path) -> tuple[Capability, ...]:
    name = f"amp_team_capabilities_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # a dataclass declared there looks its module up in sys.modules
    try:
        spec.loader.exec_module(module)
    except HarnessError as exc:  # a Capability(...) with a wrong field: its line, then the fix
        raise HarnessError(f"line {_line_in(exc, path)}: {exc}") from None
    except Exception as exc:
        raise HarnessError(
            f"line {_line_in(exc, path)}: importing it raised {type(exc).__name__}: {exc}. Fix "
            f"the file (`python {path}` shows the traceback)"
        ) from exc
    declared = getattr(module, "CAPABILITIES", None)
    if not isinstance(declared, list | tuple):
        raise _not_declared("CAPABILITIES", declared)
    for index, capability in enumerate(declared):
        if not isinstance(capability, Capability):
            raise _not_declared(f"CAPABILITIES[{index}]", capability)
        if [c.name for c in declared].count(capability.name) > 1:
            raise HarnessError(
                f"CAPABILITIES[{index}]: {capability.name!r} is declared twice: keep one"
            )
    return tuple(declared)


def _line_in(exc: BaseException, path: Path) -> int | str:
    """The line of `path` an exception raised in (its innermost frame there), or '?'."""
    lines = [
        frame.lineno
        for frame in traceback.extract_tb(exc.__traceback__)
        if Path(frame.filename).resolve() == path.resolve()
    ]
    return lines[-1] if lines else getattr(exc, "lineno", None) or "?"


def _not_declared(where: str, found: object) -> HarnessError:
    return HarnessError(
        f"{where} is {found!r}: declare CAPABILITIES = [Capability(name, text, probe, "
        "expected), ...] with harness.lab.devices.Capability (docs/writing-a-scenario.md)"
    )


def _probe_team(capability: Capability, device_type: str) -> Probe:
    seen = run_probe(lambda: capability.probe(device_type))
    if not isinstance(seen, Probe):
        raise HarnessError(
            f"Capability({capability.name!r}): probe({device_type!r}) returned {seen!r}: return "
            "Probe(works, saw), e.g. Probe(ok, f'a C++ compiler at {path}')"
        )
    return seen
