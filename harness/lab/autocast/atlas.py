"""The autocast atlas: every documented autocast rule measured on a device and dtype.

Each op of harness.lab.autocast.ops.CALLS is called inside `torch.autocast(device, dtype)`:
- with float32 inputs: an op that computes in the autocast dtype returns it ("lower");
- with inputs in the autocast dtype: an op that computes in float32 returns float32 ("float32");
- for the ops the docs put on the promote list, with inputs of both dtypes: float32 ("promote");
- otherwise the op runs in its input's dtype ("input").
The dtype an op computed in is its first floating-point (or complex) output's; an op whose outputs
are all integers (`matrix_rank`) is read from the dtype its kernel was given (probes.OpLog).
Each result is then held against the documented lists of the running release
(harness.lab.autocast.docs).

Backward runs outside autocast, as in training; each input's gradient must come back in that
input's dtype. An op that cannot be called in this build even without autocast (the CPU docs
named torch.eig up to 2.4, removed in 2.0; torch.cholesky raises "removed" from 2.14) is
"absent": named, not held against any list.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_leaves

from harness.lab import probes
from harness.lab.autocast import ops as autocast_ops
from harness.lab.autocast.docs import NO_LIST, Documented, aten, listed

REAL_PART = {torch.complex32: torch.float16, torch.complex64: torch.float32}
_CASTS = {"_to_copy", "to", "clone", "copy_", "detach", "lift_fresh", "alias"}


@dataclass
class OpResult:
    op: str
    from_float32: torch.dtype | None  # what it computed in, given float32 inputs
    from_low: torch.dtype | None  # given inputs in the autocast dtype
    mixed: torch.dtype | None = None  # given both (measured for the documented promote ops)
    error: str = ""  # the first line of what a call raised
    grads_match: bool | None = None  # every input's gradient in that input's dtype (None: none)
    behaviour: str = "input"

    def describe(self) -> str:
        if self.behaviour == "error":
            return f"error: {self.error}"
        return self.behaviour


@dataclass
class Check:
    op: str
    documented: str  # "lower", "float32", "promote", "raises" or NO_LIST
    measured: str  # OpResult.describe()
    holds: bool
    hardware: str = ""  # where it does not hold: the hardware's lack that explains it


# Ops whose kernel for a 16-bit dtype exists on some hardware only (a capability of
# harness.lab.devices): where the hardware lacks it, the op raises under autocast whatever its
# autocast rule. On the CPU, autocast runs nn.LSTM as oneDNN's mkldnn_rnn_layer.
HARDWARE_KERNELS: dict[tuple[str, torch.dtype], dict[str, str]] = {
    ("cpu", torch.bfloat16): {"mkldnn_rnn_layer": "bf16_rnn"},
    ("cpu", torch.float16): {"mkldnn_rnn_layer": "fp16_rnn"},
}


@dataclass
class Atlas:
    device: str
    dtype: torch.dtype
    results: dict[str, OpResult]
    absent: dict[str, str] = field(default_factory=dict)  # op -> what it raises without autocast


def output_dtype(out) -> torch.dtype | None:
    """The dtype of `out`'s first floating-point (or complex: its real part's) tensor, if any."""
    for t in tree_leaves(out):
        if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()):
            return REAL_PART.get(t.dtype, t.dtype)
    return None


def as_real(t: torch.Tensor) -> torch.Tensor:
    """A complex tensor as its real and imaginary parts (what a backward can start from)."""
    return torch.view_as_real(t.resolve_conj()) if t.is_complex() else t


def _computed_in(out, log: probes.OpLog) -> torch.dtype | None:
    """The dtype the op computed in: its first floating-point output's, or, where it returns
    integers only, the first floating-point dtype a kernel (not a cast) was given."""
    found = output_dtype(out)
    if found is not None:
        return found
    kernels = [op for op in log.ops if op.name not in _CASTS and op.inputs]
    return kernels[0].inputs[0] if kernels else None


def _backward(out, leaves: list[torch.Tensor]) -> bool | None:
    """Backward outside autocast from the first differentiable output; whether each leaf's
    gradient came back in the leaf's dtype (None: nothing to differentiate)."""
    first = next(
        (t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad), None
    )
    if first is None:
        return None
    try:
        as_real(first).float().sum().backward()
    except RuntimeError:  # no derivative for this op (or not in this dtype): nothing to hold
        return None
    grads = [(leaf.grad.dtype, leaf.dtype) for leaf in leaves if leaf.grad is not None]
    return all(grad == dtype for grad, dtype in grads) if grads else None


def _call(name: str, device: torch.device, dtype, low: torch.dtype, autocast: bool):
    """One call of `name`: (the dtype it computed in, whether its gradients matched)."""
    maker = autocast_ops.Maker(device, dtype, low)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated ops are called on purpose
        with probes.OpLog() as log, torch.autocast(device.type, dtype=low, enabled=autocast):
            out = autocast_ops.CALLS[name](maker)
        computed = _computed_in(out, log)
        return computed, _backward(out, maker.leaves)


def _first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:200]


def measure_op(
    name: str, device: torch.device, low: torch.dtype, mixed: bool, autocast: bool = True
) -> OpResult:
    try:
        from_float32, grads_float32 = _call(name, device, torch.float32, low, autocast)
    except Exception as error:  # noqa: BLE001 - what the op raised is the measurement
        return OpResult(name, None, None, error=_first_line(error), behaviour="raises")
    result = OpResult(name, from_float32, None, grads_match=grads_float32)
    try:
        result.from_low, grads_low = _call(name, device, low, low, autocast)
        if mixed:
            result.mixed, _ = _call(name, device, autocast_ops.MIXED, low, autocast)
    except Exception as error:  # noqa: BLE001
        result.error, result.behaviour = _first_line(error), "error"
        return result
    ran = [match for match in (grads_float32, grads_low) if match is not None]
    result.grads_match = all(ran) if ran else None
    if from_float32 == low:
        result.behaviour = "lower"
    elif result.from_low == torch.float32:
        result.behaviour = "float32"
    elif mixed and result.mixed == torch.float32:
        result.behaviour = "promote"
    return result


def measure(
    device: torch.device, low: torch.dtype, documented: Documented, autocast: bool = True
) -> Atlas:
    """Every op of autocast_ops.CALLS on `device` under autocast to `low` (or, for the negative
    control, with autocast off); the documented promote ops also with mixed inputs."""
    results, absent = {}, {}
    for name in autocast_ops.CALLS:
        mixed = listed(name, documented, device.type) == "promote"
        result = measure_op(name, device, low, mixed, autocast)
        if result.behaviour == "raises":
            plain = measure_op(name, device, low, mixed=False, autocast=False)
            if plain.behaviour == "raises":  # not autocast's doing: the op cannot run here
                absent[name] = plain.error
                continue
        results[name] = result
    return Atlas(device.type, low, results, absent)


def own_rule(name: str, device: str) -> bool:
    """Whether autocast registers a rule of its own for the aten op `name` reaches on `device`
    (Autocast<Device> has a kernel for it), as opposed to an op whose dtype changes only
    downstream of a listed op it is made of (`tensordot` is `mm`s)."""
    key = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA"}[device]
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{aten(name)}", key)
    except RuntimeError:  # no aten op of that name: a composite of others
        return False


def judge(
    atlas: Atlas, documented: Documented, lacking: dict[str, str] | None = None
) -> dict[str, list[Check]]:
    """Each op held against the documented list it is on, grouped by list. An op on no list must
    run in its input's dtype, or change it only downstream of a listed op it is made of; a rule
    of its own that the docs do not list, or an error, is a mismatch. "grads": every op whose
    backward ran, its inputs' gradients in their own dtypes. `lacking`: op -> why this hardware
    has no kernel for it in this dtype (HARDWARE_KERNELS): an op of those that raises is still
    a mismatch, and the check says the hardware explains it."""
    lacking = lacking or {}
    checks: dict[str, list[Check]] = {"lower": [], "float32": [], "promote": [], NO_LIST: []}
    for name, result in atlas.results.items():
        where = listed(name, documented, atlas.device)
        measured = result.describe()
        if where == NO_LIST:
            kept = (result.from_float32, result.from_low) == (torch.float32, atlas.dtype)
            downstream = result.behaviour != "error" and not own_rule(name, atlas.device)
            holds = kept or downstream
            if not kept and downstream:
                measured += ", downstream of a listed op"
            elif not kept and result.behaviour != "error":
                measured += ", a rule of its own"
        else:
            holds = {
                "lower": result.from_float32 == atlas.dtype,
                "float32": result.from_low == torch.float32,
                "promote": result.mixed == torch.float32,
                "raises": result.behaviour == "raises",
            }[where]
        group = "float32" if where == "raises" else where
        explained = lacking.get(name, "") if result.behaviour == "raises" and not holds else ""
        checks[group].append(Check(name, where, measured, holds, explained))
    checks["grads"] = [
        Check(name, "input's dtype", "matches" if r.grads_match else "differs", bool(r.grads_match))
        for name, r in atlas.results.items()
        if r.grads_match is not None
    ]
    return checks
