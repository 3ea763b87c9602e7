"""The global torch state that changes what a scenario measures, read before each scenario test
and checked after it.

A scenario that leaves `torch.set_flush_denormal(True)`, a float16 default dtype, an autocast
region entered or gradients off behind makes the tests after it fail with messages that read as
a changed torch ("min subnormal 1.18e-38", a refuted claim), and names nothing. The plugin takes
`snapshot()` before each scenario test, fails the test that leaves it changed with `changes()`
(each switch, before -> after) and puts it back with `restore()` before the next test runs.

Each switch is read and written through torch's own API; one this build lacks is left out. The
order of SWITCHES is the order of restoring: a general precision setting rewrites the specific
ones under it (torch.set_float32_matmul_precision sets cuda.matmul and mkldnn.matmul, the global
fp32_precision every backend's), so the general comes first and the specific are written after.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from harness.common.errors import HarnessError
from harness.lab import tf32
from harness.lab.autocast import torch_compile

# The precision switches under torch.backends, general before specific: the fp32_precision
# settings (torch >= 2.9; mkldnn's decide CPU matmuls and convolutions in bf16 or tf32), the
# legacy TF32 flags where a build has no fp32_precision (reading one after the new API was used
# is an error), and the reduced-precision GEMM switches. Named `precision.<path>`, as the
# fingerprint's (harness.records.fingerprint.precision_flags) are.
_FP32_PRECISION = (
    "fp32_precision",
    "cuda.matmul.fp32_precision",
    "cudnn.fp32_precision",
    "cudnn.conv.fp32_precision",
    "cudnn.rnn.fp32_precision",
    "mkldnn.fp32_precision",
    "mkldnn.matmul.fp32_precision",
    "mkldnn.conv.fp32_precision",
    "mkldnn.rnn.fp32_precision",
)
_LEGACY_TF32 = ("cuda.matmul.allow_tf32", "cudnn.allow_tf32")
_REDUCED_PRECISION = (
    "cuda.matmul.allow_fp16_reduced_precision_reduction",
    "cuda.matmul.allow_bf16_reduced_precision_reduction",
    "cuda.matmul.allow_fp16_accumulation",
)
# Which kernels run, and so which rounding: cuDNN's and oneDNN's on or off, cuDNN's choice.
_KERNEL_CHOICE = ("cudnn.enabled", "cudnn.deterministic", "cudnn.benchmark", "mkldnn.enabled")


@dataclass(frozen=True)
class Unreadable:
    """A switch torch refused to read (float32_matmul_precision after the legacy and the new
    TF32 API were mixed): shown as such, never written back."""

    error: str

    def __str__(self) -> str:
        return f"unreadable ({self.error})"


@dataclass(frozen=True)
class Switch:
    name: str
    read: Callable[[], object]
    write: Callable[[object], None]

    def value(self) -> object:
        try:
            with warnings.catch_warnings():  # a switch a newer torch deprecates still counts
                warnings.simplefilter("ignore")
                return self.read()
        except RuntimeError as exc:
            return Unreadable(type(exc).__name__)


def _backend(path: str) -> Switch:
    parent, _, leaf = path.rpartition(".")
    owner = operator.attrgetter(parent)(torch.backends) if parent else torch.backends

    def write(value: object) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            setattr(owner, leaf, value)

    prefix = "torch" if path in _KERNEL_CHOICE else "precision"
    return Switch(f"{prefix}.{path}", lambda: getattr(owner, leaf), write)


def _present(path: str) -> bool:
    try:
        operator.attrgetter(path)(torch.backends)
    except (AttributeError, RuntimeError):
        return False
    return True


def _autocast_nesting() -> int:
    torch.autocast_increment_nesting()
    return torch.autocast_decrement_nesting()


def _set_autocast_nesting(level: int) -> None:
    """Leave `level` autocast regions open, as entering and leaving them would (the cache of
    cast weights is cleared once none is)."""
    now = _autocast_nesting()
    for _ in range(level - now):
        torch.autocast_increment_nesting()
    for _ in range(now - level):
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()


def _deterministic() -> str:
    if not torch.are_deterministic_algorithms_enabled():
        return "off"
    return "warn only" if torch.is_deterministic_algorithms_warn_only_enabled() else "on"


def _set_deterministic(mode: object) -> None:
    torch.use_deterministic_algorithms(mode != "off", warn_only=mode == "warn only")


def _set_default_device(device: object) -> None:
    # The CPU is torch's own default: None removes the default device rather than setting one.
    torch.set_default_device(None if device == torch.device("cpu") else device)


def _autocast(device: str) -> list[Switch]:
    return [
        Switch(f"torch.autocast.{device}.enabled", lambda: torch.is_autocast_enabled(device),
               lambda on: torch.set_autocast_enabled(device, on)),
        Switch(f"torch.autocast.{device}.dtype", lambda: torch.get_autocast_dtype(device),
               lambda dtype: torch.set_autocast_dtype(device, dtype)),
    ]  # fmt: skip


@functools.cache
def switches() -> tuple[Switch, ...]:
    """Every switch this build has, in the order of restoring."""
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    precision = _FP32_PRECISION if tf32.new_tf32_api() else _LEGACY_TF32
    paths = [p for p in (*precision, *_REDUCED_PRECISION, *_KERNEL_CHOICE) if _present(p)]
    return (
        Switch("torch.default_dtype", torch.get_default_dtype, torch.set_default_dtype),
        Switch("torch.default_device", torch.get_default_device, _set_default_device),
        Switch("torch.flush_denormal", torch_compile.flushes_denormals, torch.set_flush_denormal),
        Switch("torch.grad_enabled", torch.is_grad_enabled, torch.set_grad_enabled),
        *[switch for device in devices for switch in _autocast(device)],
        Switch("torch.autocast.nesting", _autocast_nesting, _set_autocast_nesting),
        Switch("torch.autocast.cache_enabled", torch.is_autocast_cache_enabled,
               torch.set_autocast_cache_enabled),
        Switch("precision.float32_matmul_precision", torch.get_float32_matmul_precision,
               torch.set_float32_matmul_precision),
        *map(_backend, paths),
        Switch("torch.deterministic_algorithms", _deterministic, _set_deterministic),
        Switch("torch.threads", torch.get_num_threads, torch.set_num_threads),
    )  # fmt: skip


def snapshot() -> dict[str, object]:
    """Every switch's value now, by name."""
    return {switch.name: switch.value() for switch in switches()}


def changes(before: dict[str, object], after: dict[str, object]) -> list[str]:
    """What differs, one `name: before -> after` each, in the order of `switches()`."""
    return [
        f"{name}: {before[name]} -> {after[name]}" for name in before if before[name] != after[name]
    ]


def restore(before: dict[str, object]) -> list[str]:
    """Put back every switch that differs from `before`; the names of those that could not be
    (unreadable before, or torch refused), which the tests after this one still see changed."""
    for switch in switches():
        value = before[switch.name]
        if isinstance(value, Unreadable) or switch.value() == value:
            continue  # read again each time: a general switch written above may have set it
        try:
            switch.write(value)
        except (RuntimeError, TypeError, ValueError):
            continue  # said below: it still differs
    now = snapshot()
    return [name for name in before if before[name] != now[name]]


@contextlib.contextmanager
def kept(what: str):
    """The guard a team's code runs in outside a test (a capability's probe, before any test):
    what the block leaves changed is put back, and a HarnessError names `what`, each switch
    (before -> after) and the fix, as a test that leaves it changed fails. Where the block
    raised, its state is put back and its exception goes on."""
    before = snapshot()
    try:
        yield
    except BaseException:
        restore(before)
        raise
    changed = changes(before, snapshot())
    if changed:
        stuck = restore(before)
        raise HarnessError(
            f"{what} left torch's global state changed: {'; '.join(changed)}"
            + (f" (not put back: {', '.join(stuck)})" if stuck else " (put back)")
            + ". Fix: change it inside a with-block (torch.autocast(...), torch.no_grad(), ...) "
            "or restore it in a try/finally"
        )


def as_params(state: dict[str, object]) -> dict[str, str]:
    """The state as a record's params: what each test ran under, beside its numbers."""
    return {name: str(value) for name, value in state.items()}
