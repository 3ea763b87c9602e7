"""The autocast atlas compiled: every op of the atlas under torch.compile, held against eager.

Each op is called as the eager atlas calls it (harness.lab.autocast.ops.CALLS), from the very
inputs eager was given (a `Replay` of its Maker's), inside a function compiled under autocast.
Per op and per input dtype (float32; the autocast dtype; both, for the documented promote ops):
- the dtype it computed in (its first floating-point output's), exactly;
- its floating-point outputs against eager's, within the autocast dtype's rounding (an op may
  round through it inside, whatever its output's dtype): TOLERANCE_EPS epsilons of it,
  relative to the largest entry of eager's output; integer outputs exactly;
- each input's gradient (backward outside autocast, as in training, from the first
  differentiable output in float32, summed with fixed random weights): its dtype exactly, its
  values within the same tolerance.
An op whose eager outputs differ between two eager calls from the same inputs (a random op) has
its values left uncompared, and says so.

Grouping. Compiling 200 ops one by one would take minutes, so CHUNK ops share one graph: each
reads only its own inputs and returns its outputs as the graph's, so no op consumes another's
result, fusion cannot carry one op's precision into another's output, and every output's dtype
is read where that op returns it. The graph is compiled whole (fullgraph): a chunk that cannot be
(a graph break, an op dynamo cannot trace, a derivative that does not exist) is split in halves
until the op that fails stands alone, named "not compiled" with the error's first line, and the
others are measured. An op without a derivative in eager is compiled without gradients.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_leaves

from harness.lab.autocast import ops as autocast_ops
from harness.lab.autocast import torch_compile
from harness.lab.autocast.atlas import as_real, output_dtype

CHUNK = 24  # ops per graph: 9 graphs per input dtype for the atlas's 200
TOLERANCE_EPS = 4  # epsilons of an output's dtype: a few roundings apart, as CMP-BLOCK-DTYPES
NOT_COMPILED = "not compiled"
QUIET_LOGGERS = ("torch._subclasses.fake_tensor", "torch._dynamo", "torch._inductor")


def tolerance(dtype: torch.dtype) -> float:
    """How far a compiled value may lie from eager's, relative to eager's largest entry."""
    return TOLERANCE_EPS * torch.finfo(dtype).eps


@dataclass
class Call:
    """One op's eager call under autocast from one input dtype, kept to compare with."""

    op: str
    inputs: list[torch.Tensor]  # what its Maker handed out, in order
    outputs: list[torch.Tensor]  # its tensor outputs, flattened
    grads: list[torch.Tensor | None] | None  # each input's gradient; None: no backward
    random: bool  # a second eager call gave other values


@dataclass
class OpCompiled:
    op: str
    computed: dict[str, torch.dtype | None] = field(default_factory=dict)  # input dtype -> it
    mismatches: list[str] = field(default_factory=list)  # each difference from eager, in words
    error: str = ""  # why it was not compiled
    random: bool = False

    @property
    def behaviour(self) -> str:
        return NOT_COMPILED if self.error else "measured"


def _tensors(out) -> list[torch.Tensor]:
    return [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]


def _loss(outputs: list[torch.Tensor]) -> torch.Tensor | None:
    """The first differentiable output in float32, summed with fixed random weights: a plain
    sum is constant for a normalisation (softmax sums to 1, instance_norm to 0), so its
    gradients would be rounding noise and no comparison of them would mean anything."""
    first = next((t for t in outputs if t.requires_grad), None)
    if first is None:
        return None
    real = as_real(first)
    weights = torch.randn(real.shape, generator=torch.Generator().manual_seed(1))
    return (real.float() * weights.to(real.device)).sum()


def _fresh(inputs: list[torch.Tensor], grads: bool) -> list[torch.Tensor]:
    return [t.detach().clone().requires_grad_(grads and t.requires_grad) for t in inputs]


def _eager(op: str, device: torch.device, dtype, low: torch.dtype) -> Call | None:
    """The op's eager call, or None where it raises (the eager atlas names those)."""
    maker = autocast_ops.Maker(device, dtype, low)
    try:
        with torch.autocast(device.type, dtype=low):
            out = autocast_ops.CALLS[op](maker)
        outputs = _tensors(out)
        again = _replayed(op, device, low, _fresh(maker.made, grads=False))
    except Exception:  # noqa: BLE001 - an op that cannot run here: the eager atlas says so
        return None
    random = any(not _same(a, b) for a, b in zip(outputs, again, strict=False))
    grads = None
    try:
        loss = _loss(outputs)
        if loss is not None:
            loss.backward()
            grads = [t.grad if t.requires_grad else None for t in maker.made]
    except RuntimeError:  # no derivative for this op: compiled without gradients
        grads = None
    return Call(op, maker.made, [t.detach() for t in outputs], grads, random)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.detach(), b.detach())


def _replayed(op: str, device: torch.device, low: torch.dtype, inputs: list[torch.Tensor]):
    with torch.autocast(device.type, dtype=low):
        return _tensors(autocast_ops.CALLS[op](autocast_ops.Replay(device, inputs)))


def _chunk_function(calls: list[Call], device: torch.device, low: torch.dtype) -> Callable:
    """One function calling each op of `calls` from its own slice of the arguments."""
    sizes = [len(c.inputs) for c in calls]

    def chunk(*flat: torch.Tensor) -> list[list[torch.Tensor]]:
        outs, start = [], 0
        for call, size in zip(calls, sizes, strict=True):
            outs.append(_replayed(call.op, device, low, list(flat[start : start + size])))
            start += size
        return outs

    return chunk


def _run_chunk(calls: list[Call], device, low, backend) -> list[tuple[list, list | None]]:
    """Each op's compiled outputs and its inputs' gradients (None where eager had none)."""
    inputs = [_fresh(c.inputs, grads=c.grads is not None) for c in calls]
    flat = [t for group in inputs for t in group]
    with torch_compile.denormals_kept():  # torch 2.4's inductor kernels turn flush-to-zero on
        outs = torch_compile.fresh(_chunk_function(calls, device, low), backend)(*flat)
        losses = [_loss(o) for c, o in zip(calls, outs, strict=True) if c.grads is not None]
        losses = [loss for loss in losses if loss is not None]
        if losses:
            torch.stack(losses).sum().backward()
    return [
        (o, [t.grad if t.requires_grad else None for t in group] if c.grads is not None else None)
        for c, o, group in zip(calls, outs, inputs, strict=True)
    ]


@contextlib.contextmanager
def _quiet_tracing() -> Iterator[None]:
    """Dynamo logs a failed fake-tensor call at ERROR level before raising it: the error comes
    back named in the op's verdict, so the log would only repeat it, once per halving."""
    loggers = [logging.getLogger(name) for name in QUIET_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _compile(calls: list[Call], device, low, backend, failed: dict[str, str]) -> dict:
    """op -> (outputs, grads) for every op of `calls` that compiles; the others into `failed`,
    found by halving a chunk that raises until the op that raises stands alone."""
    try:
        with warnings.catch_warnings(), _quiet_tracing():
            warnings.simplefilter("ignore")  # deprecated ops are called on purpose
            results = _run_chunk(calls, device, low, backend)
        return {c.op: r for c, r in zip(calls, results, strict=True)}
    except Exception as error:  # noqa: BLE001 - what the compiler raised is the measurement
        if len(calls) == 1:
            failed[calls[0].op] = torch_compile.error_line(error)
            return {}
        half = len(calls) // 2
        return _compile(calls[:half], device, low, backend, failed) | _compile(
            calls[half:], device, low, backend, failed
        )


def _gap(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest difference relative to eager's largest entry (0 for two zero tensors)."""
    got, want = (as_real(t.detach()).double() for t in (got, want))
    both_nan = got.isnan() & want.isnan()
    diff = (got - want).abs().masked_fill(both_nan | (got == want), 0.0)
    scale = want.abs().masked_fill(~want.isfinite(), 0.0).max().item() if want.numel() else 0.0
    worst = diff.max().item() if diff.numel() else 0.0
    return worst / scale if scale > 0 else worst


def _compare(call: Call, label: str, outputs: list, grads: list | None, low) -> list[str]:
    """Each way the compiled call differs from eager's, in words."""
    found, allowed = [], tolerance(low)
    if len(outputs) != len(call.outputs):
        return [f"{label}: {len(outputs)} outputs, eager {len(call.outputs)}"]
    for i, (got, want) in enumerate(zip(outputs, call.outputs, strict=True)):
        where = f"{label}: output {i}"
        if got.dtype != want.dtype or got.shape != want.shape:
            found.append(f"{where} {_short(got.dtype)}{list(got.shape)}, eager "
                         f"{_short(want.dtype)}{list(want.shape)}")  # fmt: skip
        elif call.random:
            continue
        elif not (want.is_floating_point() or want.is_complex()):
            if not torch.equal(got, want):
                found.append(f"{where} differs from eager's integers")
        elif _gap(got, want) > allowed:
            found.append(f"{where} off eager's by {_gap(got, want):.3g}")
    for i, (got, want) in enumerate(zip(grads or [], call.grads or [], strict=False)):
        if want is None or got is None:
            if (want is None) != (got is None):
                found.append(f"{label}: input {i}'s gradient {'missing' if got is None else 'new'}")
            continue
        if got.dtype != want.dtype:
            found.append(f"{label}: input {i}'s gradient {_short(got.dtype)}, eager "
                         f"{_short(want.dtype)}")  # fmt: skip
        elif not call.random and _gap(got, want) > allowed:
            found.append(f"{label}: input {i}'s gradient off eager's by {_gap(got, want):.3g}")
    return found


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def measure(
    device: torch.device,
    low: torch.dtype,
    backend,
    mixed_ops: frozenset[str] = frozenset(),
    ops: list[str] | None = None,
) -> dict[str, OpCompiled]:
    """Every op of `ops` (the atlas's, by default) that runs eagerly here, compiled with
    `backend` under autocast to `low`, from float32 inputs, from `low` inputs and, for
    `mixed_ops` (the documented promote list), from both: op -> what differs from eager."""
    names = list(autocast_ops.CALLS) if ops is None else ops
    found: dict[str, OpCompiled] = {}
    variants = {"float32": torch.float32, _short(low): low, "mixed": autocast_ops.MIXED}
    for label, dtype in variants.items():
        chosen = [n for n in names if dtype != autocast_ops.MIXED or n in mixed_ops]
        calls = [c for c in (_eager(n, device, dtype, low) for n in chosen) if c is not None]
        calls = [c for c in calls if not (c.op in found and found[c.op].error)]
        failed: dict[str, str] = {}
        results = {}
        for start in range(0, len(calls), CHUNK):
            results |= _compile(calls[start : start + CHUNK], device, low, backend, failed)
        for call in calls:
            entry = found.setdefault(call.op, OpCompiled(call.op, random=call.random))
            if call.op in failed:
                entry.error = failed[call.op]
                continue
            outputs, grads = results[call.op]
            entry.computed[label] = output_dtype(outputs)
            entry.mismatches += _compare(call, f"from {label}", outputs, grads, low)
    return found
