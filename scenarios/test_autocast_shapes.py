"""Autocast in the shapes users write: a training loop and its regions, nested regions.

Claims: AMP-MASTER-FP32, AMP-AUTO-DTYPE (decided on one model, one step, one region in
test_amp_mechanics.py; here in the shapes around it).

Measured on torch 2.4.1, 2.5.1, 2.6.0, 2.9.1, 2.13.0 and 2.14.1 (CPU, bfloat16 and float16),
the same on all of them:
- autocast keeps the low-precision copy it casts of a weight (a leaf that requires grad) in a
  cache, keyed by the weight alone, and clears it only when the outermost region exits. An
  in-place update does not invalidate it. So with a region per step the forward of step n+1
  sees the weights step n wrote; with one region around the loop, or with a region per step
  inside an outer region (even an `autocast(enabled=False)` one: it counts as a region too),
  every forward after the first is bit-identical to the first though the weights changed.
  `cache_enabled=False` on the long region is the fix.
- an `autocast(enabled=False)` block inside a region runs its ops in their inputs' dtype:
  float32 inputs stay float32, the outer region's low-precision outputs stay low unless cast
  with `.float()`, and the outer region's choice is back after the block; backward through the
  block runs its matmuls in float32 and the gradients reach the layers before it.
- a float16 region with a bfloat16 region inside: fresh ops inside run in bfloat16, float16 is
  back after it. But a layer run on both sides of the switch gets the copy of its weight the
  other side cached (the cache does not look at the dtype) and its matmul raises on the mixed
  dtypes; `cache_enabled=False` on the inner region is the fix.
The cache is ATen's (autocast_mode.cpp), shared by every device: predicted alike on CUDA.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from harness.lab import probes

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32

LOW_DTYPES = [
    pytest.param(BF16, marks=pytest.mark.requires("bf16_autocast"), id="bfloat16"),
    pytest.param(F16, marks=pytest.mark.requires("fp16_autocast"), id="float16"),
]


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _names(names) -> str:
    return ", ".join(names) or "none"


def _region(amp_device, low: torch.dtype, options: dict | None):
    """An autocast region with `options` (enabled, cache_enabled), or none where None."""
    if options is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=amp_device.type, dtype=low, **options)


def _seeded(make, amp_device):
    """What `make` builds from the global generator seeded 0 (forked: the caller's is left as it
    was), moved to the device."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return tuple(t.to(amp_device.torch_device) for t in make())


def _verdict(held: list[str], tried: list[str]) -> str:
    """Every shape held: confirmed; none: refuted; some: partly (the evidence names which)."""
    return "confirmed" if len(held) == len(tried) else "partly" if held else "refuted"


def _shapes_evidence(held: list[str], tried: list[str]) -> str:
    failed = [shape for shape in tried if shape not in held]
    return f"{len(held)} of {len(tried)} shapes held ({_names(held)}); failed: {_names(failed)}"


# --- the weight-cast cache across training steps -------------------------------------------

STEPS = 3  # two updates for a later forward to see
LR = 0.1  # moves a weight by 0.04 a step or more, far above bfloat16's spacing near 0.5 (2**-8)


@dataclass(frozen=True)
class LoopShape:
    """Where a training loop's autocast regions are: around the whole loop and around each
    step's forward (autocast options, or None for no region), and whether each forward is
    predicted to see the update of the step before."""

    name: str
    around_loop: dict | None
    around_step: dict | None
    sees_updates: bool


# Only the outermost region's exit clears autocast's cache, and a disabled region counts as one:
# measured the same on every release from 2.4.1 to 2.14.1.
LOOP_SHAPES = {
    "per_step_region": LoopShape("a region per step", None, {}, sees_updates=True),
    "one_region": LoopShape("one region around the loop", {}, None, sees_updates=False),
    "per_step_inside_a_region": LoopShape(
        "a region per step inside an outer region", {}, {}, sees_updates=False
    ),
    "per_step_inside_a_disabled_region": LoopShape(
        "a region per step inside autocast(enabled=False)",
        {"enabled": False},
        {},
        sees_updates=False,
    ),
}
UNCACHED = LoopShape(
    "one region around the loop with cache_enabled=False",
    {"cache_enabled": False},
    None,
    sees_updates=True,
)


@dataclass
class Loop:
    """What the forwards of one training loop saw against the weights they ran with."""

    updates: int  # forwards after an update
    saw_update: int  # of those, bit-identical to a fresh forward of the weights then
    stale: int  # of those, bit-identical to the forward before although the weights changed
    first_fresh: bool  # the first forward equals the fresh one: the reference is right
    gap: float  # largest |forward - fresh forward| over the loop
    gap_relative: float  # that, over the fresh forward's largest entry
    weight_change: float  # the smallest step's largest change of an fp32 weight

    @property
    def sees_updates(self) -> bool:
        return self.saw_update == self.updates


def _fresh_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, low) -> torch.Tensor:
    """What autocast's linear computes from these fp32 weights with nothing cached: the same
    kernel on copies cast now. Written out, so that the reference does not rest on autocast."""
    return F.linear(x.to(low), weight.to(low), bias.to(low))


def _train(amp_device, low: torch.dtype, shape: LoopShape) -> Loop:
    """STEPS SGD steps of a Linear(4, 4) with its forward under `shape`'s regions: each
    forward's output against a fresh forward of the weights it ran with."""
    layer, x = _seeded(lambda: (nn.Linear(4, 4), torch.randn(8, 4)), amp_device)
    optimizer = torch.optim.SGD(layer.parameters(), lr=LR)
    outputs, weights = [], []
    with _region(amp_device, low, shape.around_loop):
        for _ in range(STEPS):
            weights.append((layer.weight.detach().clone(), layer.bias.detach().clone()))
            with _region(amp_device, low, shape.around_step):
                out = layer(x)
                loss = out.float().pow(2).mean()
            outputs.append(out.detach())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    fresh = [_fresh_forward(x, w, b, low) for w, b in weights]
    gaps = [float((o.float() - f.float()).abs().max()) for o, f in zip(outputs, fresh, strict=True)]
    worst = max(range(STEPS), key=gaps.__getitem__)
    after = list(zip(outputs[1:], fresh[1:], outputs[:-1], strict=True))  # each later forward
    return Loop(
        updates=len(after),
        saw_update=sum(torch.equal(out, new) for out, new, _ in after),
        stale=sum(torch.equal(out, before) for out, _, before in after),
        first_fresh=torch.equal(outputs[0], fresh[0]),
        gap=gaps[worst],
        gap_relative=gaps[worst] / float(fresh[worst].float().abs().max()),
        weight_change=min(
            float((w[0] - v[0]).abs().max()) for w, v in zip(weights[1:], weights[:-1], strict=True)
        ),
    )


def _loop_evidence(shape: LoopShape, loop: Loop) -> str:
    seen = f"{shape.name}: {loop.saw_update} of {loop.updates} forwards saw the update"
    if loop.sees_updates:
        return seen
    return (
        f"{seen}, {loop.stale} bit-identical to the forward before, off a fresh forward by up "
        f"to {loop.gap:.3g} ({loop.gap_relative:.1%} of its largest entry)"
    )


def _mispredicted(shape: LoopShape, loop: Loop) -> str | None:
    """How the loop differs from `shape`'s prediction, or None where it is as predicted."""
    if not loop.first_fresh:
        return f"predicted the first forward equal to the fresh one (the reference) in {shape.name}"
    if shape.sees_updates and not loop.sees_updates:
        return f"predicted every forward sees the update in {_loop_evidence(shape, loop)}"
    if not shape.sees_updates and not (loop.stale == loop.updates and loop.gap > 0):
        return (
            f"predicted every forward after the first stale (bit-identical to the one before, "
            f"off a fresh forward) in {_loop_evidence(shape, loop)}"
        )
    return None


@pytest.mark.claim("AMP-MASTER-FP32")
@pytest.mark.parametrize("low", LOW_DTYPES)
def test_each_step_sees_the_update(record, amp_device, low):
    loops = {key: _train(amp_device, low, shape) for key, shape in LOOP_SHAPES.items()}
    # Negative control: the long region's pitfall fixed by cache_enabled=False: every forward
    # casts the weights anew and sees the update.
    uncached = _train(amp_device, low, UNCACHED)

    record.param(autocast_dtype=_short(low), steps=STEPS, lr=LR, model="Linear(4, 4), SGD")
    for key, loop in loops.items():
        record.metric(**{f"stale_forwards/{key}": loop.stale, f"fresh_gap/{key}": loop.gap})
        record.key_metric(**{f"sees_new_weights/{key}": int(loop.sees_updates)})
    record.key_metric(**{"sees_new_weights/one_region_uncached": int(uncached.sees_updates)})

    tried = [shape.name for shape in LOOP_SHAPES.values()]
    held = [LOOP_SHAPES[key].name for key, loop in loops.items() if loop.sees_updates]
    change = min(loop.weight_change for loop in loops.values())
    record.verdict(
        "AMP-MASTER-FP32",
        _verdict(held, tried),
        f"{_short(low)} autocast on {amp_device.type}, a Linear(4, 4) trained {STEPS} steps "
        f"by SGD, its fp32 weights changed by at least {change:.3g} a step: "
        + "; ".join(_loop_evidence(LOOP_SHAPES[key], loop) for key, loop in loops.items())
        + f"; control, {_loop_evidence(UNCACHED, uncached)}. "
        + _shapes_evidence(held, tried),
    )
    assert change > 0, f"AMP-MASTER-FP32: predicted the fp32 weights updated, changed {change}"
    wrong = [_mispredicted(LOOP_SHAPES[key], loop) for key, loop in loops.items()]
    assert not any(wrong), "AMP-MASTER-FP32: " + "; ".join(filter(None, wrong))
    control = _mispredicted(UNCACHED, uncached)
    assert control is None, f"AMP-MASTER-FP32: control: {control}"


# --- an autocast(enabled=False) block inside a region ---------------------------------------


def _outcome(run) -> str:
    """The output dtype of `run()`, or the error it raised (its type and first line)."""
    try:
        return _short(run().dtype)
    except RuntimeError as error:
        return f"RuntimeError: {str(error).splitlines()[0]}"


def _block_predicted(low: torch.dtype) -> dict[str, torch.dtype]:
    """A matmul's output dtype around and in an autocast(enabled=False) block inside a `low`
    region: in the block every op runs in its inputs' dtype, so the region's output stays low
    until cast; the region's choice is back after the block."""
    return {
        "before the block": low,
        "in it on float32": F32,
        "in it on the region output": low,
        "in it on that output cast to float32": F32,
        "after it": low,
    }


def _disabled_block(amp_device, low: torch.dtype) -> tuple[dict[str, torch.dtype], str]:
    """The dtypes _block_predicted names, measured, and what a float32 layer given the region's
    output in the block does (its output dtype, or the error it raised)."""
    a, layer = _seeded(lambda: (torch.randn(4, 4), nn.Linear(4, 4)), amp_device)
    with _region(amp_device, low, {}):
        h = torch.mm(a, a)
        with _region(amp_device, low, {"enabled": False}):
            inside = [torch.mm(a, a), torch.mm(h, h), torch.mm(h.float(), h.float())]
            fp32_layer_on_low = _outcome(lambda: layer(h))
        after = torch.mm(a, a)
    dtypes = [t.dtype for t in (h, *inside, after)]
    return dict(zip(_block_predicted(low), dtypes, strict=True)), fp32_layer_on_low


@dataclass
class BlockBackward:
    """Backward through a network whose second layer runs in an autocast(enabled=False) block."""

    matmuls: dict[torch.dtype | None, int]  # backward's matmuls by inputs' dtype (None: mixed)
    grad_dtypes: set[torch.dtype]  # of every parameter's .grad
    error: float  # first layer's weight gradient against float32's, relative (Frobenius)


def _block_backward(amp_device, low: torch.dtype, disabled: bool) -> BlockBackward:
    """Linear(8, 8) under `low` autocast feeding Linear(8, 4), which runs in an
    autocast(enabled=False) block on the .float() of its input where `disabled`, else in the
    region; one backward, logged, and its first gradient against float32's."""
    first, second, x = _seeded(
        lambda: (nn.Linear(8, 8), nn.Linear(8, 4), torch.randn(16, 8)), amp_device
    )
    with _region(amp_device, low, {}):
        h = first(x)
        with _region(amp_device, low, {"enabled": False} if disabled else {}):
            out = second(h.float() if disabled else h)
        loss = out.float().pow(2).mean()
    with probes.OpLog() as log:
        loss.backward()
    grad = first.weight.grad.clone()
    first.zero_grad()
    second(first(x)).pow(2).mean().backward()  # float32, no autocast: the reference
    matmuls: dict[torch.dtype | None, int] = {}
    for op in log.matmuls():
        dtype = op.inputs[0] if len(set(op.inputs)) == 1 else None
        matmuls[dtype] = matmuls.get(dtype, 0) + 1
    return BlockBackward(
        matmuls=matmuls,
        grad_dtypes={p.grad.dtype for p in (*first.parameters(), *second.parameters())},
        error=float((grad - first.weight.grad).norm() / first.weight.grad.norm()),
    )


def _counted(matmuls: dict[torch.dtype | None, int]) -> str:
    return _names(
        f"{n} on {_short(d) if d else 'mixed dtypes'}"
        for d, n in sorted(matmuls.items(), key=lambda item: str(item[0]))
    )


def _dtypes(dtypes: dict[str, torch.dtype]) -> str:
    return ", ".join(f"{where}: {_short(dtype)}" for where, dtype in dtypes.items())


def _grad_tolerance(low: torch.dtype) -> float:
    """How far the first layer's gradient may be from float32's: it still computes in `low`."""
    return torch.finfo(low).eps


def _forward_mispredicted(low, forward: dict[str, torch.dtype], fp32_layer_on_low: str):
    """How the block's forward differs from its prediction (_block_predicted, and a float32
    layer given the region's output raising on the mixed dtypes), or None."""
    if forward == _block_predicted(low) and fp32_layer_on_low.startswith("RuntimeError"):
        return None
    return (
        f"the block's forward: predicted a matmul's output {_dtypes(_block_predicted(low))} and "
        f"a float32 layer given the region's output raising; got {_dtypes(forward)}, the layer: "
        f"{fp32_layer_on_low}"
    )


def _backward_mispredicted(low, backward: BlockBackward):
    """How backward through the block differs from its prediction, or None: the second
    layer's two matmuls in float32, the first's one in `low`, float32 .grad, and the first
    layer's gradient within _grad_tolerance of float32's."""
    predicted = {F32: 2, low: 1}
    if (
        backward.matmuls == predicted
        and backward.grad_dtypes == {F32}
        and backward.error < _grad_tolerance(low)
    ):
        return None
    return (
        f"backward through the block: predicted matmuls {_counted(predicted)}, float32 .grad, "
        f"the gradient within {_grad_tolerance(low):.2g} of float32's; got "
        f"{_counted(backward.matmuls)}, .grad {_names(sorted(map(_short, backward.grad_dtypes)))}"
        f", off by {backward.error:.2g}"
    )


@pytest.mark.claim("AMP-AUTO-DTYPE")
@pytest.mark.parametrize("low", LOW_DTYPES)
def test_disabled_block_inside_a_region(record, amp_device, low):
    forward, fp32_layer_on_low = _disabled_block(amp_device, low)
    backward = _block_backward(amp_device, low, disabled=True)
    # Negative control: the second layer left in the region: its backward matmuls are low too,
    # so the op log tells a float32 block from a low one.
    in_region = _block_backward(amp_device, low, disabled=False)

    shapes = {
        "the block's forward": forward == _block_predicted(low),
        "backward through the block": _backward_mispredicted(low, backward) is None,
    }
    record.param(
        autocast_dtype=_short(low),
        **{f"forward.{where}": _short(dtype) for where, dtype in forward.items()},
        fp32_layer_on_low_input=fp32_layer_on_low,
        backward_matmuls=_counted(backward.matmuls),
        backward_matmuls_in_region=_counted(in_region.matmuls),
    )
    record.metric(
        **{"grad_error/disabled_block": backward.error, "grad_error/in_region": in_region.error}
    )
    record.key_metric(
        **{
            "fp32_in_disabled_block/forward": int(forward["in it on float32"] == F32),
            "low_input_stays_low/forward": int(forward["in it on the region output"] == low),
            "fp32_matmuls_in_disabled_block/backward": backward.matmuls.get(F32, 0),
        }
    )

    tried = list(shapes)
    held = [shape for shape, holds in shapes.items() if holds]
    record.verdict(
        "AMP-AUTO-DTYPE",
        _verdict(held, tried),
        f"{_short(low)} autocast on {amp_device.type}, an autocast(enabled=False) block inside; "
        f"a matmul's output: {_dtypes(forward)}; a float32 layer given the region's output in "
        f"the block: {fp32_layer_on_low}; backward through a Linear(8, 4) in the block ran its "
        f"matmuls {_counted(backward.matmuls)} (left in the region: "
        f"{_counted(in_region.matmuls)}), .grad {_names(sorted(map(_short, backward.grad_dtypes)))}"
        f", the first layer's weight gradient off float32's by {backward.error:.2g} (tolerance "
        f"{_grad_tolerance(low):.2g}). " + _shapes_evidence(held, tried),
    )
    wrong = [
        _forward_mispredicted(low, forward, fp32_layer_on_low),
        _backward_mispredicted(low, backward),
    ]
    assert not any(wrong), "AMP-AUTO-DTYPE: " + "; ".join(filter(None, wrong))
    assert in_region.matmuls == {low: 3}, (
        f"AMP-AUTO-DTYPE: control: predicted every backward matmul {_short(low)} with no block, "
        f"got {_counted(in_region.matmuls)}"
    )


# --- a dtype switch inside a region: float16 outside, bfloat16 inside -----------------------


@dataclass(frozen=True)
class SwitchShape:
    """What runs in a float16 region with a bfloat16 region inside: the regions its ops run in,
    in order, and whether each op is predicted to run in its region's dtype."""

    name: str
    regions: tuple[str, ...]
    holds: bool


# Measured on every release from 2.4.1 to 2.14.1: a cast weight is cached by the weight alone,
# not its dtype, so the side of the switch that runs a layer second is given the other side's
# copy, and the layer's matmul raises on the mixed dtypes.
SWITCH_SHAPES = {
    "fresh_ops": SwitchShape(
        "a matmul before, inside and after the switch", ("float16", "bfloat16", "float16"), True
    ),
    "layer_before_and_inside": SwitchShape(
        "a layer run before the switch and inside it", ("float16", "bfloat16"), False
    ),
    "layer_inside_and_after": SwitchShape(
        "a layer run inside the switch and after it", ("bfloat16", "float16"), False
    ),
}


def _switch(amp_device, inner: dict) -> dict[str, tuple[str, ...]]:
    """Each SWITCH_SHAPES entry run, with `inner` autocast options (cache_enabled) on the
    bfloat16 region: the dtype of each op's output, or the error it raised."""
    a, first, second = _seeded(
        lambda: (torch.randn(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)), amp_device
    )
    outer_region = functools.partial(_region, amp_device, F16, {})
    inner_region = functools.partial(_region, amp_device, BF16, inner)
    with outer_region():
        before = _outcome(lambda: torch.mm(a, a))
        with inner_region():
            inside = _outcome(lambda: torch.mm(a, a))
        after = _outcome(lambda: torch.mm(a, a))
    with outer_region():
        first_outside = _outcome(lambda: first(a))
        with inner_region():
            first_inside = _outcome(lambda: first(a))
    with outer_region():
        with inner_region():
            second_inside = _outcome(lambda: second(a))
        second_outside = _outcome(lambda: second(a))
    return {
        "fresh_ops": (before, inside, after),
        "layer_before_and_inside": (first_outside, first_inside),
        "layer_inside_and_after": (second_inside, second_outside),
    }


def _switch_evidence(runs: dict[str, tuple[str, ...]]) -> str:
    return "; ".join(
        f"{SWITCH_SHAPES[key].name}: {' / '.join(outcomes)} "
        f"(in {' / '.join(SWITCH_SHAPES[key].regions)} regions)"
        for key, outcomes in runs.items()
    )


def _switch_mispredicted(shape: SwitchShape, outcomes: tuple[str, ...]) -> str | None:
    """How a shape's run differs from its prediction: every op in its region's dtype, or (where
    the shape does not hold) the first in its region's dtype and the second raising."""
    predicted = shape.regions if shape.holds else (shape.regions[0], "RuntimeError")
    if all(o.startswith(p) for o, p in zip(outcomes, predicted, strict=True)):
        return None
    return f"{shape.name}: predicted {' / '.join(predicted)}, got {' / '.join(outcomes)}"


@pytest.mark.claim("AMP-AUTO-DTYPE")
@pytest.mark.requires("fp16_autocast", "bf16_autocast")
def test_dtype_switch_inside_a_region(record, amp_device):
    runs = _switch(amp_device, {})
    # Negative control: the layers' pitfall fixed by cache_enabled=False on the bfloat16
    # region: each side casts its own copy and every op runs in its region's dtype.
    uncached = _switch(amp_device, {"cache_enabled": False})

    holds = {key: runs[key] == shape.regions for key, shape in SWITCH_SHAPES.items()}
    fixed = {key: uncached[key] == shape.regions for key, shape in SWITCH_SHAPES.items()}
    record.param(
        outcomes=_switch_evidence(runs), outcomes_inner_uncached=_switch_evidence(uncached)
    )
    record.key_metric(**{f"in_region_dtype/{key}": int(h) for key, h in holds.items()})
    record.key_metric(**{f"in_region_dtype/{key}_uncached": int(h) for key, h in fixed.items()})

    tried = [shape.name for shape in SWITCH_SHAPES.values()]
    held = [SWITCH_SHAPES[key].name for key, h in holds.items() if h]
    record.verdict(
        "AMP-AUTO-DTYPE",
        _verdict(held, tried),
        f"a float16 region with a bfloat16 region inside on {amp_device.type}, output dtypes: "
        f"{_switch_evidence(runs)}; control, cache_enabled=False inside: "
        f"{_switch_evidence(uncached)}. " + _shapes_evidence(held, tried),
    )
    wrong = [_switch_mispredicted(shape, runs[key]) for key, shape in SWITCH_SHAPES.items()]
    assert not any(wrong), "AMP-AUTO-DTYPE: " + "; ".join(filter(None, wrong))
    assert all(fixed.values()), (
        f"AMP-AUTO-DTYPE: control: predicted every op in its region's dtype with "
        f"cache_enabled=False inside, got {_switch_evidence(uncached)}"
    )
