"""A team's own capabilities, declared beside its scenarios (`scenarios/capabilities.py`, the
list CAPABILITIES of `Capability(name, text, probe, expected)`, harness.lab.machine.capabilities):
loaded by the plugin with `with_team_capabilities`, probed once, and held to the rules of the
built-in ones (docs/writing-a-scenario.md).

A team's probe is the team's code at the harness's boundary, run before any test, so it runs
bounded: a time limit (PROBE_LIMIT_S: a probe that hangs said no, with where it hung), an exit
(`sys.exit`, any BaseException) is a probe that said no, what it returns is checked (a `Probe`
whose `works` is a bool), and it runs inside the guard the plugin gives (the global-state
guard every test runs in: a probe that leaves torch's default dtype changed would change every
test after it). Ctrl-C or SIGTERM during a probe stops the session naming the probe.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from harness.common.errors import HarnessError
from harness.lab.machine.capabilities import CAPABILITY_TEXT, Capability
from harness.lab.machine.device import DeviceInfo
from harness.lab.machine.probes import Probe, run_probe

# How long a team's probe may run: a probe runs a tiny real case (a built-in one takes well
# under a second; the slowest, a first torch.compile, about 13 s on 2 cores).
PROBE_LIMIT_S = 60.0
Guard = Callable[[str], AbstractContextManager]  # what a probe runs inside, given its name


def with_team_capabilities(
    device: DeviceInfo, path: Path, guard: Guard | None = None
) -> DeviceInfo:
    """`device` with the capabilities declared in `path` (a team's capabilities.py, its list
    CAPABILITIES), each probed now, once, as the built-in ones are, each inside `guard(name)`;
    `device` as it is where there is no such file. A declaration that cannot be used is a
    HarnessError naming the file, the entry and the fix."""
    if not path.is_file():
        return device
    guard = guard or (lambda _name: contextlib.nullcontext())
    try:
        declared = _load_capabilities(path)
        probed = {c.name: _probe_team(c, device.type, guard) for c in declared}
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


class _TimedOut(BaseException):
    """A team's probe ran past PROBE_LIMIT_S (a BaseException: a probe's `except Exception`
    does not keep it from stopping)."""


def _probe_team(capability: Capability, device_type: str, guard: Guard) -> Probe:
    called = f"Capability({capability.name!r}): probe({device_type!r})"
    started = time.monotonic()
    try:
        with guard(called), _time_limit(PROBE_LIMIT_S):
            seen = run_probe(lambda: capability.probe(device_type))
    except _TimedOut:
        return Probe(False, f"it did not answer within {PROBE_LIMIT_S:g} s (stopped there)",
                     traceback.format_exc())  # fmt: skip
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM taken as it: the session stops
        raise HarnessError(
            f"{called}: interrupted ({type(exc).__name__} {exc}) after "
            f"{time.monotonic() - started:.0f} s of probing; nothing was recorded"
        ) from None
    except HarnessError:  # the guard's: a probe that left torch's state changed
        raise
    except BaseException as exc:  # sys.exit(3), ...: a probe that ended is one that said no
        return Probe(False, f"it raised {type(exc).__name__}({exc}): a probe returns "
                     "Probe(False, why) rather than exiting", traceback.format_exc())  # fmt: skip
    if not isinstance(seen, Probe):
        raise HarnessError(
            f"{called} returned {seen!r}: return Probe(works, saw), e.g. Probe(ok, f'a C++ "
            "compiler at {path}')"
        )
    if not isinstance(seen.works, bool):  # Probe('no', ...) counted as working
        raise HarnessError(
            f"{called} returned Probe(works={seen.works!r}): works is a bool (e.g. bool(found))"
            + _read_as(seen.works)
        )
    if not isinstance(seen.saw, str):
        raise HarnessError(
            f"{called} returned Probe(saw={seen.saw!r}): saw is a str, what the probe saw in "
            "words (the skip or failure reason reads it)"
        )
    return seen


def _read_as(value: object) -> str:
    """What a `works` that is no bool would have counted as, where Python can say."""
    try:
        return f"; {value!r} would read as {'true' if value else 'false'}"
    except Exception:  # a tensor of several elements has no truth value
        return ""


@contextlib.contextmanager
def _time_limit(seconds: float):
    """Raise _TimedOut in the block after `seconds`, by SIGALRM: only the main thread of a
    process gets signals, so elsewhere (and where there is no SIGALRM) the block runs unbounded.
    A timer already set (pytest-timeout's) is put back, less the time the block took."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(
        signal, "setitimer"
    ):
        yield
        return

    def stop(_signum, _frame) -> None:
        raise _TimedOut

    started = time.monotonic()
    previous = signal.signal(signal.SIGALRM, stop)
    remaining, interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if remaining:
            left = max(remaining - (time.monotonic() - started), 0.001)
            signal.setitimer(signal.ITIMER_REAL, left, interval)
