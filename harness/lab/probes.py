"""Observers attached to a model or to a region of code, that say what precision did. (The
module keeps the name scenarios import it by, `probes`; in the harness's words a probe checks
what the machine can do, harness.lab.machine.probes, and an observer watches a run:
docs/architecture.md.)

- `outputs(model)`: per module, its forward output's dtype, max |x| against the dtype's largest
  finite value (headroom), inf and NaN counts, and the dtype of the gradient that reaches the
  output in backward;
- `gradients(model)`: over the parameters' `.grad`, the fraction of entries that are zero, and
  that are zero or subnormal in fp16 (would underflow if held in fp16), the non-zero ones fp16
  rounds to zero (lost without loss scaling), inf and NaN counts;
- `OpLog()`: every aten op that runs, forward and backward, with the dtypes its kernel was given
  and returned (a TorchDispatchMode: it sees the dtypes after autocast's casts).

Each is a context manager that removes its hooks, or leaves the dispatch stack, on exit:

    with probes.outputs(model) as seen, probes.OpLog() as log:
        loss = loss_fn(model(x), y)
        loss.backward()
    seen["linear1"].dtype, seen["linear1"].headroom, log.matmuls()
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

FP16_TINY = torch.finfo(torch.float16).tiny  # 2**-14: the smallest normal fp16 value

# The aten ops that multiply matrices or convolve: where forward and backward do their
# arithmetic. Every device dispatches them under these names (cuBLAS and cuDNN are the CUDA
# kernels behind the same aten ops), so one list serves CPU and CUDA.
MATMULS = frozenset(
    getattr(torch.ops.aten, name)
    for name in ("mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "convolution")
) | {torch.ops.aten.convolution_backward}


def headroom(t: torch.Tensor) -> float:
    """The dtype's largest finite value over max |t| (finite entries): how far the values are
    from overflowing; inf when every entry is zero, 0 when an entry is inf."""
    if not t.is_floating_point() or t.numel() == 0:
        return math.inf
    if torch.isinf(t).any():
        return 0.0
    peak = float(torch.nan_to_num(t.detach(), nan=0.0).abs().max())
    return math.inf if peak == 0 else torch.finfo(t.dtype).max / peak


class OutputStats:
    """One module's forward output (its first floating-point tensor).

    Its numbers are reduced on the tensor's device when the hook runs, and read (one
    synchronisation) when first asked for: a hook that synchronised would put its cost inside
    the step a caller times (`amp-harness diagnose` times its steps with the observers on)."""

    def __init__(self, t: torch.Tensor):
        x = t.detach()
        self.dtype: torch.dtype = t.dtype
        zero = torch.zeros((), dtype=torch.float64, device=x.device)
        finite_abs = torch.where(torch.isfinite(x), x.abs(), 0) if x.numel() else None
        # [max |x| over the finite entries, inf count, NaN count], on x's device.
        self._summary = torch.stack(
            [
                finite_abs.amax().double() if finite_abs is not None else zero,
                torch.isinf(x).sum().double(),
                torch.isnan(x).sum().double(),
            ]
        )
        self._read: list[float] | None = None
        self.grad_dtype: torch.dtype | None = None  # of the gradient reaching it, after backward
        self._grad_peak: torch.Tensor | None = None

    def _numbers(self) -> list[float]:
        if self._read is None:
            self._read = self._summary.tolist()
        return self._read

    @property
    def max_abs(self) -> float:
        """Over the finite entries."""
        return self._numbers()[0]

    @property
    def inf(self) -> int:
        return int(self._numbers()[1])

    @property
    def nan(self) -> int:
        return int(self._numbers()[2])

    @property
    def headroom(self) -> float:
        """finfo(dtype).max / max_abs; 0 when an entry is inf, inf when every entry is zero."""
        if self.inf:
            return 0.0
        return math.inf if self.max_abs == 0 else torch.finfo(self.dtype).max / self.max_abs

    @property
    def grad_max_abs(self) -> float | None:
        """The largest |entry| of the gradient reaching the output, once backward ran."""
        return None if self._grad_peak is None else float(self._grad_peak)

    def saw_gradient(self, grad: torch.Tensor) -> None:
        """The output's gradient hook: its dtype now, its peak reduced on the device."""
        self.grad_dtype = grad.dtype
        g = grad.detach()
        self._grad_peak = g.abs().amax() if g.numel() else torch.zeros((), device=g.device)


def _named(modules: nn.Module | Iterable[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
    if isinstance(modules, nn.Module):
        return [(name, m) for name, m in modules.named_modules() if name]  # not the root
    return list(modules)


@contextlib.contextmanager
def outputs(
    modules: nn.Module | Iterable[tuple[str, nn.Module]],
) -> Iterator[dict[str, OutputStats]]:
    """Per module name, the stats of its last forward output (`modules`: a model, whose
    submodules are watched, or (name, module) pairs, e.g. a loss function beside the model).
    A module called twice keeps its last call's."""
    seen: dict[str, OutputStats] = {}

    def hook(name: str, _module, _inputs, out) -> None:
        first = next(
            (t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()),
            None,
        )
        if first is None:
            return
        seen[name] = stats = OutputStats(first)
        if first.requires_grad:
            first.register_hook(stats.saw_gradient)

    handles = [
        module.register_forward_hook(lambda m, i, o, name=name: hook(name, m, i, o))
        for name, module in _named(modules)
    ]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


@dataclass(frozen=True)
class GradientStats:
    """Over every entry of the parameters' `.grad` (parameters without one are left out)."""

    entries: int
    zero: int  # exactly 0
    fp16_underflow: int  # |g| < 2**-14, zero included: zero or subnormal once held in fp16
    inf: int
    nan: int
    fp16_flushed: int = 0  # non-zero entries that are 0 once held in fp16: lost without scaling

    @property
    def zero_fraction(self) -> float:
        return self.zero / self.entries if self.entries else 0.0

    @property
    def fp16_underflow_fraction(self) -> float:
        return self.fp16_underflow / self.entries if self.entries else 0.0


def gradients(model: nn.Module) -> GradientStats:
    """What the gradients of `model` hold now (call it after backward, before zero_grad)."""
    grads = [p.grad.detach() for p in model.parameters() if p.grad is not None]
    return GradientStats(
        entries=sum(g.numel() for g in grads),
        zero=sum(int((g == 0).sum()) for g in grads),
        fp16_underflow=sum(int((g.float().abs() < FP16_TINY).sum()) for g in grads),
        inf=sum(int(torch.isinf(g).sum()) for g in grads),
        nan=sum(int(torch.isnan(g).sum()) for g in grads),
        fp16_flushed=sum(int(((g != 0) & (g.to(torch.float16) == 0)).sum()) for g in grads),
    )


@dataclass(frozen=True)
class Op:
    name: str  # "mm"
    inputs: tuple[torch.dtype, ...]  # dtypes of its floating-point tensor arguments
    output: torch.dtype | None  # of its (first) tensor result
    matmul: bool


class OpLog(TorchDispatchMode):
    """Every aten op run while the mode is on, with the dtypes its kernel is given. Autocast is
    dispatched before the Python key, so these are the dtypes after autocast's casts; the autograd
    engine carries the mode into its device threads, so a CUDA backward is logged as well."""

    def __init__(self):
        super().__init__()
        self.ops: list[Op] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        inputs = tuple(
            t.dtype
            for t in tree_leaves((args, kwargs or {}))
            if isinstance(t, torch.Tensor) and t.is_floating_point()
        )
        out = func(*args, **(kwargs or {}))
        first = next((t for t in tree_leaves(out) if isinstance(t, torch.Tensor)), None)
        self.ops.append(
            Op(
                func.__name__.split(".")[0],
                inputs,
                None if first is None else first.dtype,
                func.overloadpacket in MATMULS,
            )
        )
        return out

    def matmuls(self, dtype: torch.dtype | None = None) -> list[Op]:
        """The matmuls logged, or those whose floating-point inputs were all `dtype`."""
        mms = [op for op in self.ops if op.matmul]
        return mms if dtype is None else [op for op in mms if set(op.inputs) == {dtype}]


@dataclass
class StepGradients:
    """A `train(..., on_step=...)` callback that keeps `gradients(model)` of every step."""

    steps: list[GradientStats] = field(default_factory=list)

    def __call__(self, model: nn.Module, _report) -> None:
        self.steps.append(gradients(model))


# --- every op's output range, named by the module that ran it ------------------------------

# Ops whose output is a view of, or a fresh constant beside, their input: no new values to see.
_NO_NEW_VALUES = frozenset(
    getattr(torch.ops.aten, name)
    for name in ("detach", "empty_like", "zeros_like", "ones_like", "full_like", "empty_strided")
    if hasattr(torch.ops.aten, name)
)


# Ops that write a constant where a mask says (an attention mask's -inf): a non-finite output
# there is intended, not an overflow.
_FILLS = frozenset(
    getattr(torch.ops.aten, name)
    for name in ("masked_fill", "masked_fill_", "fill", "fill_", "index_fill", "index_fill_")
    if hasattr(torch.ops.aten, name)
)


@dataclass
class OpCall:
    """One op's call in a forward pass: where it ran and what its output held."""

    key: str  # "module.path:op" ("model:exp" for an op in the root module's own forward)
    dtype: torch.dtype  # of its (first floating-point) output
    peak: float  # max |output|: inf when an entry is inf, nan when one is NaN
    input_peak: float | None  # max |input| over its activations (parameters left out), if any
    fill: bool  # the op writes constants (masked_fill): its non-finite values are intended

    @property
    def nonfinite(self) -> bool:
        return not math.isfinite(self.peak)

    @property
    def created(self) -> bool:
        """It made inf/NaN from finite activations: where an overflow happens."""
        made_here = self.input_peak is not None and math.isfinite(self.input_peak)
        return self.nonfinite and made_here and not self.fill


class OpRanges(TorchDispatchMode):
    """Every aten op that runs inside a model's forward (and the loss beside it), with its
    output's range and its inputs', named by the innermost module running at the time ("model"
    for the root's own forward, "loss" outside it): functional code (an attention's `q @ k.T`,
    an `exp` in a forward, a tied output layer) is seen as well as leaf modules. Autocast is
    dispatched before the Python key, so the dtypes are the ones autocast chose.

    One reduction per output and per activation input (parameters, and autocast's copies of
    them, are left out: they are the large tensors, and an op's weights say nothing of whether
    it makes large values from small ones). Each is read back once, by `read()`, after the step:
    reading inside the op would synchronise a CUDA device for every op."""

    ROOT, LOSS = "model", "loss"  # the model's own forward; code outside it (the loss)

    def __init__(self):
        super().__init__()
        self.path: list[str] = []  # the modules whose forward is running, innermost last
        self._parameters: set[int] = set()
        self._copies: set[int] = set()  # this step's casts of parameters (autocast's cache)
        self._calls: list[tuple[str, torch.dtype, torch.Tensor, torch.Tensor | None, bool]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view or func.overloadpacket in _NO_NEW_VALUES:
            return out
        first = next(
            (t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()),
            None,
        )
        if first is None or first.numel() == 0:
            return out
        tensors = [
            t
            for t in tree_leaves((args, kwargs or {}))
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()
        ]
        known = self._parameters | self._copies
        activations = [t for t in tensors if _storage(t) not in known]
        if tensors and not activations and func.overloadpacket is torch.ops.aten._to_copy:
            self._copies.add(_storage(first))  # a parameter cast by autocast: a parameter too
            return out
        peaks = [_peak(t).to(first.device) for t in activations]
        where = self.path[-1] if self.path else self.LOSS
        self._calls.append(
            (
                f"{where}:{func.overloadpacket.__name__}",
                first.dtype,
                _peak(first),
                torch.stack(peaks).amax() if peaks else None,
                func in _FILLS or func.overloadpacket in _FILLS,
            )
        )
        return out

    def forward_starts(self, model: nn.Module) -> None:
        """Where the model's parameters are now: a half model, or one moved to a device, has
        new ones since the last forward."""
        self._parameters = {_storage(p) for p in model.parameters()}

    def read(self) -> list[OpCall]:
        """The calls since the last read, in the order they ran (one synchronisation)."""
        calls, self._calls = self._calls, []
        self._copies.clear()  # autocast's cache is gone with its region
        if not calls:
            return []
        # Stacked where they were computed, then copied once: a copy per call would synchronise
        # a CUDA device once per op.
        device = calls[0][2].device
        nan = torch.full((), math.nan, dtype=torch.float64, device=device)
        numbers = (
            torch.stack(
                [
                    torch.stack([p.to(device), nan if i is None else i.to(device)])
                    for _k, _d, p, i, _f in calls
                ]
            )
            .cpu()
            .tolist()
        )
        return [
            OpCall(key, dtype, peak, None if math.isnan(inp) and i is None else inp, fill)
            for (key, dtype, _p, i, fill), (peak, inp) in zip(calls, numbers, strict=True)
        ]


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _peak(t: torch.Tensor) -> torch.Tensor:
    """max |t| in one kernel (inf when an entry is inf, nan when one is NaN), in float64."""
    return torch.linalg.vector_norm(t.detach(), ord=math.inf).double()


@contextlib.contextmanager
def op_ranges(model: nn.Module) -> Iterator[OpRanges]:
    """An OpRanges that names each op by the module running it, and the hooks that tell it which
    that is; enter `log` itself around the code to watch (the forward and the loss):

        with probes.op_ranges(model) as log:
            with log:
                loss = loss_fn(model(x), y)
            calls = log.read()
    """
    log = OpRanges()

    def enter(name: str) -> None:
        if not log.path:
            log.forward_starts(model)
        log.path.append(name)

    def leave() -> None:
        if log.path:
            log.path.pop()

    handles = []
    for name, module in model.named_modules():
        label = name or OpRanges.ROOT
        handles.append(module.register_forward_pre_hook(lambda *_a, n=label: enter(n)))
        handles.append(module.register_forward_hook(lambda *_a: leave(), always_call=True))
    try:
        yield log
    finally:
        for handle in handles:
            handle.remove()
