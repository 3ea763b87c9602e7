"""Automatic mixed precision under torch.compile: the claims of the built-in catalogue
harness/catalogue/claims_compile.toml (CMP-...), each decided against eager from the same
weights and batches, with backend="aot_eager" (dynamo and AOTAutograd, then eager kernels) and
backend="inductor" (its own code generation and fusion on top), so that a mismatch, named
(subject, eager, compiled, backend), says which layer it comes from.

The subject is a small block (376 parameters): a Linear, scaled_dot_product_attention, a
LayerNorm, GELU(x) * x and a softmax, and an autocast(enabled=False) region of two float32
Linears, `out` fed the norm's low-precision output cast up, `skip` fed the block's float32
input. It is compiled with fullgraph=True, run under an ambient autocast region (as a training
loop wraps its model's forward and loss) and its backward called outside it, as torch.amp's
docs say to.

Measured on the CPU (bfloat16 and float16) on torch 2.4.1, 2.5.1, 2.6.0, 2.9.1, 2.13.0 and
2.14.1; docs/autocast-atlas.md ("Compiled autocast") has the verdicts per release and a
reproduction of each mismatch:
- AOTAutograd traces a compiled region's backward under the autocast its forward ran in (the
  documented default "same_as_forward" of torch._functorch.config.backward_pass_autocast, a
  switch since 2.9; the only behaviour before), so the backward of an autocast(enabled=False)
  region runs its matmuls in the low dtype where eager's runs in float32: both backends, every
  release. backward_pass_autocast="off" restores eager's backward.
- Inductor fuses the region's `.float()` of the norm's low-precision output with the norm and
  reads it unrounded where eager rounded it to the low dtype first; emulate_precision_casts
  keeps eager's rounding where the CPU backend takes it.
- A float32 operand given the region's low-precision input without `.float()` raises in eager;
  inductor computes it in float32, silently, before 2.12.
- Before 2.7 dynamo guards no ambient autocast dtype: the block compiled under bfloat16 and
  called under float16 runs its bfloat16 graph, on both backends.
- Before 2.13 (2.12 not measured) AOTAutograd's cache, where it is on (by default from 2.7),
  keys no autocast dtype: a recompile under float16 in the same cache is served the graph
  compiled under bfloat16. Each test compiles into a fresh cache of its own, so that only a
  test's own compiles meet in it: the switch's recompile here.
- 2.4.1's and 2.5.1's inductor kernels turn flush-to-zero on for the process when they load,
  where the C++ compiler links crtfastmath.o into them (probed: torch_compile.fast_math_flushes;
  put back after each compiled call here); 2.5.1's inductor cannot compile the attention's
  backward under autocast at static shapes: its own outcome, "cannot compile", never the
  claim's verdict, which the arms that compiled decide.
- The rest holds as eager: dtypes exact and values within the low dtype's rounding, each step's
  weights seen inside one long autocast region (where eager forwards the first step's cached
  casts), GradScaler's skip on inf and NaN, dynamic shapes, and a loss curve within fp32's own
  spread.
Every release's difference is predicted for that release (a Change each in harness.lab.releases,
asked under "what the project predicts"), so that each test passes on all six and fails where a
behaviour changes.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from harness.lab import releases
from harness.lab.autocast import torch_compile

# torch.compile traces and compiles each block: about a minute on a 2-core CPU, so
# `amp-harness run` leaves this module out unless --all (the plugin's `slow` marker).
pytestmark = pytest.mark.slow

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
BACKENDS = torch_compile.BACKENDS  # ("aot_eager", "inductor")
LOW_DTYPES = [
    pytest.param(BF16, marks=pytest.mark.requires("bf16_autocast"), id="bfloat16"),
    pytest.param(F16, marks=pytest.mark.requires("fp16_autocast"), id="float16"),
]
WIDTH, BATCH, SEQ, SEED = 8, 2, 4, 0  # the block's width and its batch's shape, (2, 4, 8)
# Relative to the reference's largest entry. A value computed in the low dtype may differ from
# eager's by a rounding of the low dtype anywhere along its chain (inductor keeps fused
# intermediates in float32, by design): 4 of its epsilons. One computed in float32 from the same
# inputs differs by float32's reordering alone: 2**-16 is 500 of float32's epsilons and still
# 8 times below float16's rounding (2**-11), so it tells a float32 computation from a low one.
LOW_ROUNDINGS, FP32_TOLERANCE = 4, 2.0**-16
COMPUTED_LOW = ("linear", "attention", "layer_norm", "gelu*x", "softmax")  # the block's outputs
RAISED = "compile and run"  # the subject of a mismatch where the compiled run raised
DENORMALS = "float32 subnormals after the call"  # where it turned flush-to-zero on
SERVED = "the block's compiled graph"  # where a cache served the other low dtype's graph
OTHER = {BF16: F16, F16: BF16}


@pytest.fixture(autouse=True)
def _fresh_inductor_cache():
    """A cache of the test's own (inductor's, and AOTAutograd's inside it): nothing another test
    or an earlier session compiled is served to it, so that no verdict depends on test order
    or on the disk. The cache's key is CMP-DTYPE-SWITCH's own test
    (scenarios/test_compiled_parity.py)."""
    with torch_compile.fresh_cache_dir():
        yield


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _tolerance(low: torch.dtype) -> float:
    return LOW_ROUNDINGS * torch.finfo(low).eps


# --- the block, its batches, one forward and backward ----------------------------------------


class Block(nn.Module):
    """Attention, a norm, a gated activation and a softmax under autocast, with an
    autocast(enabled=False) region of two float32 Linears: `out` fed the norm's low-precision
    output cast up (what a region is usually given), `skip` fed the block's float32 input
    (nothing low-precision before it, so that its backward alone shows the dtype backward runs
    in)."""

    def __init__(self, width: int):
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)
        self.norm = nn.LayerNorm(width)
        self.out = nn.Linear(width, width)
        self.skip = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        attention = F.scaled_dot_product_attention(q, k, v)
        norm = self.norm(attention)
        gated = F.gelu(norm) * norm
        with torch.autocast(x.device.type, enabled=False):
            from_low, from_input = self.out(norm.float()), self.skip(x)
        return {
            "linear": q,
            "attention": attention,
            "layer_norm": norm,
            "gelu*x": gated,
            "softmax": torch.softmax(gated, dim=-1),
            "from_low": from_low,
            "from_input": from_input,
        }


def _block(amp_device) -> Block:
    """The block's weights, the same for every arm (seeded; the caller's generator is left as
    it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return Block(WIDTH).to(amp_device.torch_device)


def _batch(amp_device, seed: int = SEED, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape or (BATCH, SEQ, WIDTH), generator=generator).to(
        amp_device.torch_device
    )


def _weights(width: int, device: torch.device, dtype=F32) -> torch.Tensor:
    return torch.linspace(-1, 1, width, device=device, dtype=dtype)


def _loss(outputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Each output weighted across its last dimension (a softmax's plain sum is constant: it
    would give no gradient), squared, averaged, and summed, in float32."""
    return sum(
        (out.float() * _weights(out.shape[-1], out.device)).pow(2).mean()
        for out in outputs.values()
    )


@dataclass
class Run:
    """One forward under autocast and one backward outside it: the outputs and the gradients
    (of each parameter, and of the "input"), or what raised where compiling or running did."""

    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    grads: dict[str, torch.Tensor] = field(default_factory=dict)
    error: str = ""
    flushed: bool = False  # it turned the process's flush-to-zero on (put back since)


def _leaf(x: torch.Tensor) -> torch.Tensor:
    """A batch that requires its gradient, as every run's does: one graph per dtype serves all
    the tests (a batch without it is another graph, compiled anew)."""
    return x.detach().clone().requires_grad_()


def _forward_backward(
    model: Block, call: Callable, x: torch.Tensor, low, amp_device, backward: bool = True
) -> Run:
    x = _leaf(x)
    model.zero_grad(set_to_none=True)
    with torch.autocast(amp_device.type, dtype=low):
        outputs = call(x)
        loss = _loss(outputs)
    if not backward:  # the training forward alone (AOTAutograd builds the backward lazily)
        return Run({k: v.detach() for k, v in outputs.items()})
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
    return Run({k: v.detach() for k, v in outputs.items()}, {**grads, "input": x.grad.detach()})


def _attempt(measure: Callable[[], Run]) -> Run:
    """A compiled run: an exception compiling or running it is what was measured (2.5.1's
    inductor failing to fuse the attention's backward), kept as the run's error; so is a
    flush-to-zero mode it turned on (2.4's inductor), put back for what follows."""
    with torch_compile.denormals_kept() as flushed:
        try:
            run = measure()
        except Exception as exc:  # BackendCompilerFailed, InductorError, AssertionError, ...
            run = Run(error=torch_compile.error_line(exc))
    run.flushed = flushed[0]
    return run


# The block's runs at its batch, by (device type, dtype, backend or None for eager, setting):
# the tests of the dtypes and of the disabled region read the same runs, each compiled once.
_RUNS: dict[tuple, Run] = {}


def _run(amp_device, low, backend=None, setting=None, backward: bool = True) -> Run:
    key = (amp_device.type, low, backend, setting and setting.label, backward)
    if key not in _RUNS:
        model, x = _block(amp_device), _batch(amp_device)
        if backend is None:
            _RUNS[key] = _forward_backward(model, model, x, low, amp_device, backward)
        else:

            def measure() -> Run:
                call = torch_compile.fresh(model, backend)
                return _forward_backward(model, call, x, low, amp_device, backward)

            with setting.applied() if setting else contextlib.nullcontext():
                _RUNS[key] = _attempt(measure)
    return _RUNS[key]


# --- comparing a run with eager's --------------------------------------------------------------


@dataclass(frozen=True)
class Mismatch:
    """Where a compiled run differs from eager's: (subject, eager, compiled, backend)."""

    subject: str
    eager: str
    compiled: str
    backend: str

    def __str__(self) -> str:
        return f"({self.subject}, eager: {self.eager}, compiled: {self.compiled}, {self.backend})"


def _raised(run: Run, backend: str) -> list[Mismatch]:
    return [Mismatch(RAISED, "runs", f"raised {run.error}", backend)] if run.error else []


def _gap(value: torch.Tensor, reference: torch.Tensor) -> float:
    """max |value - reference| over the reference's largest entry."""
    value, reference = value.double(), reference.double()
    return float((value - reference).abs().max() / reference.abs().max().clamp_min(1e-30))


def _block_mismatches(
    eager: Run, run: Run, low, backend: str, served_by: str | None = None
) -> list[Mismatch]:
    """How `run` differs from eager's on CMP-BLOCK-DTYPES's terms: a raise; the other low
    dtype's graph run (`served_by`: by what, where known; else the AOTAutograd cache, the one
    cause within a compile); any output's or gradient's dtype; a value of the block's
    low-precision ops, or a gradient, further from eager's than the low dtype's tolerance."""
    if run.error:
        return _raised(run, backend)
    if _served_other(run, low):
        return [_served_mismatch(low, backend, served_by or _cache_cause())]
    found = []
    for kind, ours, theirs in (("output", run.outputs, eager.outputs),
                               ("gradient", run.grads, eager.grads)):  # fmt: skip
        for name, want in theirs.items():
            got = ours[name]
            if got.dtype != want.dtype:
                subject = f"{name} {kind} dtype"
                found.append(Mismatch(subject, _short(want.dtype), _short(got.dtype), backend))
            elif (kind == "gradient" or name in COMPUTED_LOW) and _gap(got, want) > _tolerance(low):
                off = f"off by {_gap(got, want):.3g} (tolerance {_tolerance(low):.3g})"
                found.append(Mismatch(f"{name} {kind}", "the reference", off, backend))
    return found


def _served_other(run: Run, low) -> bool:
    """Whether a run under `low` autocast computed in the other low dtype throughout: it ran
    the graph compiled for that dtype (an inductor cache keyed without the autocast dtype)."""
    return not run.error and run.outputs["linear"].dtype == OTHER[low]


def _served_mismatch(low, backend: str, served_by: str) -> Mismatch:
    return Mismatch(SERVED, f"{_short(low)}'s", f"{_short(OTHER[low])}'s, {served_by}", backend)


def _cache_cause() -> str:
    """Why a recompile ran the other dtype's graph, as this release's cache says: served from
    the AOTAutograd cache where it is on; where it is off, nothing known explains it."""
    if torch_compile.autograd_cache_on():
        return (
            "compiled earlier and served from the AOTAutograd cache, whose key leaves the "
            "autocast dtype out (pytorch/pytorch#181564)"
        )
    return "with the AOTAutograd cache off: no known cause"


def _switch_cause(new_graphs: int) -> str:
    """Why a call under another autocast dtype ran the first dtype's graph: no recompile is
    Dynamo's missing guard on the ambient autocast dtype (pytorch/pytorch#112260, guarded since
    #143592); a recompile served the old graph is the cache's key (_cache_cause)."""
    if new_graphs == 0:
        return (
            "its graph reused without a recompile: Dynamo guards no ambient autocast dtype "
            "(pytorch/pytorch#112260, fixed by #143592)"
        )
    return _cache_cause()


def _named(mismatches: list[Mismatch]) -> str:
    return "; ".join(map(str, mismatches)) or "none"


def _verdict(record, failed: dict[str, bool], errors: dict[str, str]) -> str:
    """Per arm whether the claim failed there, over the arms that compiled (`errors`: what
    each arm raised, empty where it compiled): record.over_arms, so that an arm that cannot
    compile is its own outcome, never the claim's verdict."""
    return record.over_arms({b: None if errors.get(b) else bad for b, bad in failed.items()})


def _uncompiled(record, errors: dict[str, str]) -> None:
    """Which arms could not compile, as key metrics: shown apart from the claim's verdict."""
    record.key_metric(**{f"cannot_compile/{b}": int(bool(e)) for b, e in errors.items()})


def _raise_of(mismatches: list[Mismatch]) -> str:
    """What the arm raised compiling or running, where it did: its error line."""
    raised = (m.compiled for m in mismatches if m.subject.startswith(RAISED))
    return next(raised, "").removeprefix("raised ")


def _raised_in(arms: dict[str, list[Mismatch]]) -> dict[str, str]:
    return {b: _raise_of(found) for b, found in arms.items()}


def _arms(amp_device) -> tuple[list[str], str]:
    """The backends measured here (torch_compile.backends_here), or a skip where none is."""
    backends, left_out = torch_compile.backends_here(amp_device, BACKENDS)
    if not backends:  # nothing to measure here (BACKENDS held to inductor, and no compiler)
        pytest.skip(left_out.strip() or "no torch.compile backend to measure")
    return backends, left_out


def _with_setting(
    amp_device, low, backend: str, setting, compare, about: str, backward: bool = True
) -> str:
    """A mismatch re-measured with the upstream setting that should restore eager's behaviour:
    what the same comparison finds about `about` with it, or why it could not be measured. A
    forward's mismatch is re-measured on the training forward alone (`backward` False): its
    backward graph would be compiled for nothing, seconds of C++ a dtype."""
    where = f"{setting.label} ({backend})"
    if not setting.available():
        return f"{where}: not in torch {torch.__version__}"
    run = _run(amp_device, low, backend, setting, backward)
    if run.error:
        return f"{where}: raised {run.error}"
    left = [m for m in compare(run) if about in m.subject]
    return f"{where}: {'as eager' if not left else 'still ' + _named(left)}"


# --- what the project predicts, per backend and release ---------------------------------------

# What differs between releases is predicted per release: each change in harness.lab.releases
# (since, before_seen, how it was measured), asked which side the running torch is on.
SDPA_BACKWARD = "inductor-compiles-sdpa-backward"
KEEPS_DENORMALS = "inductor-keeps-denormals"
GUARDS_AUTOCAST = "dynamo-guards-autocast-dtype"
CACHE_KEYS_DTYPE = "aot-cache-keys-autocast-dtype"
CHECKS_MIXED_BMM = "inductor-checks-mixed-bmm"


def _before(change: str, device: str) -> bool:
    """Whether the running torch is predicted to behave as before `change` on `device`."""
    return releases.behaviour(change, device) == releases.BEFORE


def _predicted_error(amp_device, backend: str, dynamic: bool = False) -> bool:
    """Whether compiling the block with `backend` is predicted to raise here."""
    return (
        backend == "inductor"
        and amp_device.type == "cpu"
        and not dynamic
        and _before(SDPA_BACKWARD, amp_device.type)
    )


def _raise_as_predicted(amp_device, backend: str, error: str, dynamic=False) -> str | None:
    """None where the arm could not compile exactly where predicted (2.5.1's inductor on the
    attention's backward), else what differs. The behaviour is held, not the words: any error
    compiling or running the arm is its failure to compile (2.5.1 raises an AssertionError
    inside a BackendCompilerFailed, whose text another build may word otherwise)."""
    if _predicted_error(amp_device, backend, dynamic):
        if error:
            return None
        return (
            f"{backend}: predicted it cannot compile the attention's backward on torch "
            f"{torch.__version__} (pytorch/pytorch#138550), got no error"
        )
    return f"{backend}: raised {error}" if error else None


def _may_serve_other(backend: str) -> bool:
    """Whether the arm may be served the other low dtype's graph here (CACHE_KEYS_DTYPE: the
    cache is AOTAutograd's, the same on every device, and serves only where it is on)."""
    return (
        backend == "inductor"
        and _before(CACHE_KEYS_DTYPE, releases.ANY_DEVICE)
        and torch_compile.autograd_cache_on()
    )


def _predicted_flush(amp_device, backend: str) -> bool:
    """Whether running the block compiled with `backend` is predicted to turn flush-to-zero
    on for the process here: inductor before 2.6 builds its kernels with -ffast-math, which
    turns it on only where the C++ compiler links crtfastmath.o into a shared library (gcc
    before 13 does; clang and gcc 13 on do not): probed, not assumed."""
    return (
        backend == "inductor"
        and _before(KEEPS_DENORMALS, amp_device.type)
        and torch_compile.fast_math_flushes()[0] is True
    )


def _unpredicted(
    amp_device, backend: str, mismatches: list[Mismatch], dynamic: bool = False
) -> str | None:
    """How an arm's mismatches differ from the prediction: none, but for the raise and the
    flush-to-zero predicted where they were measured (the flush is looked for only where the
    run loads its kernels first: CMP-BLOCK-DTYPES's runs)."""
    problems = []
    flushed = any(m.subject == DENORMALS for m in mismatches)
    if flushed and not _predicted_flush(amp_device, backend):
        problems.append(f"{backend}: predicted float32 subnormals kept after the call")
    if any(m.subject == SERVED for m in mismatches) and not _may_serve_other(backend):
        problems.append(f"{backend}: predicted its own dtype's graph, got {_named(mismatches)}")
    rest = [m for m in mismatches if m.subject not in (DENORMALS, SERVED)]
    raised = _raise_of(rest)
    if raised or _predicted_error(amp_device, backend, dynamic):
        problems.append(_raise_as_predicted(amp_device, backend, raised, dynamic))
    elif rest:
        problems.append(f"{backend}: predicted as eager, got {_named(rest)}")
    return "; ".join(filter(None, problems)) or None


# --- CMP-BLOCK-DTYPES ----------------------------------------------------------------------------


@pytest.mark.claim("CMP-BLOCK-DTYPES")
@pytest.mark.parametrize("low", LOW_DTYPES)
def test_compiled_block_keeps_eager_dtypes(record, amp_device, low):
    backends, left_out = _arms(amp_device)
    eager = _run(amp_device, low)
    arms = {}
    for backend in backends:
        run = _run(amp_device, low, backend)
        arms[backend] = _block_mismatches(eager, run, low, backend) + (
            [Mismatch(DENORMALS, "kept", "flushed to zero (the process's mode, since)", backend)]
            if run.flushed
            else []
        )
    # Inductor's mismatches re-measured with the setting that should restore eager's: a graph
    # the cache served, without the cache; values, with the mode that keeps eager's roundings.
    settings, found = [], arms.get("inductor", [])
    compare = partial(_block_mismatches, eager, low=low, backend="inductor")
    if any(m.subject == SERVED for m in found):
        setting = torch_compile.NO_AUTOGRAD_CACHE
        settings.append(_with_setting(amp_device, low, "inductor", setting, compare, ""))
    elif any(m.subject not in (RAISED, DENORMALS) for m in found):
        setting = torch_compile.EAGER_ROUNDING
        settings.append(_with_setting(amp_device, low, "inductor", setting, compare, ""))
    # Negative control: eager's run held to eager's run in the other low dtype: the comparison
    # sees every low-precision output's dtype differ.
    other = F16 if low == BF16 else BF16
    control = _block_mismatches(_run(amp_device, other), eager, low, "eager")

    record.param(autocast_dtype=_short(low), backends=",".join(backends))
    record.key_metric(**{f"mismatches/{backend}": len(found) for backend, found in arms.items()})
    _uncompiled(record, errors := _raised_in(arms))
    compiler = torch_compile.fast_math_flushes()[1] if "inductor" in backends else ""
    record.verdict(
        "CMP-BLOCK-DTYPES",
        _verdict(record, {b: bool(found) for b, found in arms.items()}, errors),
        f"{_short(low)} autocast on {amp_device.type}, the block's {len(COMPUTED_LOW)} "
        f"low-precision outputs, 2 float32 ones and {len(eager.grads)} gradients against "
        f"eager's (values within {_tolerance(low):.3g} of the largest entry): "
        + "; ".join(f"{b}: {len(found)} mismatches {_named(found)}" for b, found in arms.items())
        + "".join(f"; with {text}" for text in settings)
        + f"; control, eager against eager in {_short(other)}: {len(control)} mismatches."
        + (
            f" Flush-to-zero predicted from the C++ compiler: {compiler}."
            if "inductor" in backends and _before(KEEPS_DENORMALS, amp_device.type)
            else ""
        )
        + left_out,
    )
    wrong = [_unpredicted(amp_device, b, found) for b, found in arms.items()]
    wrong += [
        f"{b}: predicted float32 subnormals flushed to zero after the call (torch "
        f"{torch.__version__}'s -ffast-math kernels, pytorch/pytorch#126848)"
        for b, found in arms.items()
        if _predicted_flush(amp_device, b)
        and not _predicted_error(amp_device, b)
        and not any(m.subject == DENORMALS for m in found)
    ]
    assert not any(wrong), "CMP-BLOCK-DTYPES: " + "; ".join(filter(None, wrong))
    low_outputs = {m.subject for m in control if m.subject.endswith("output dtype")}
    assert low_outputs == {f"{name} output dtype" for name in COMPUTED_LOW}, (
        f"CMP-BLOCK-DTYPES: control: predicted every low-precision output's dtype to differ "
        f"from {_short(other)}'s, got {_named(control)}"
    )


# --- CMP-DISABLED-REGION -------------------------------------------------------------------------

FORWARD = "the region's input (the norm's output cast up with .float())"
BACKWARD = "the region's backward (skip.weight's gradient)"


@dataclass
class Region:
    """What the autocast(enabled=False) region did in one run, held to float32 computed from
    that run's own inputs to it."""

    dtypes: tuple[torch.dtype, torch.dtype]  # of from_low and from_input
    forward_gap: float  # from_low against float32 on the run's own low-precision norm output
    backward_gap: float  # skip.weight's gradient against float64 from the run's own tensors
    error: str = ""
    graph: torch.dtype | None = None  # the low dtype the run's graph computed in


def _region(run: Run, block: Block, x: torch.Tensor) -> Region:
    if run.error:
        return Region((F32, F32), float("nan"), float("nan"), run.error)
    norm, from_input = run.outputs["layer_norm"], run.outputs["from_input"]
    graph = run.outputs["linear"].dtype
    if "skip.weight" not in run.grads:  # a forward alone
        dtypes = (run.outputs["from_low"].dtype, from_input.dtype)
        forward = F.linear(norm.float(), block.out.weight, block.out.bias).detach()
        return Region(dtypes, _gap(run.outputs["from_low"], forward), float("nan"), graph=graph)
    with torch.no_grad():
        forward = F.linear(norm.float(), block.out.weight, block.out.bias)
    # from_input's loss term is mean((from_input * w)^2): its gradient is known in closed form,
    # and skip.weight's is that gradient's product with the float32 input, here in float64:
    # what a float32 backward gives, to float32's rounding.
    upstream = 2 * from_input.double() * _weights(WIDTH, x.device, torch.float64) ** 2
    upstream = (upstream / from_input.numel()).reshape(-1, WIDTH)
    exact = upstream.T @ x.double().reshape(-1, WIDTH)
    return Region(
        (run.outputs["from_low"].dtype, from_input.dtype),
        _gap(run.outputs["from_low"], forward),
        _gap(run.grads["skip.weight"], exact),
        graph=graph,
    )


def _region_mismatches(region: Region, low, backend: str) -> list[Mismatch]:
    if region.error:
        return _raised(Run(error=region.error), backend)
    found = [_served_mismatch(low, backend, _cache_cause())] if region.graph == OTHER[low] else []
    low = region.graph  # what the graph computed in: its rounding is what the gaps are of
    if region.dtypes != (F32, F32):
        got = ", ".join(map(_short, region.dtypes))
        found.append(Mismatch("the region's output dtypes", "float32, float32", got, backend))
    if region.forward_gap > FP32_TOLERANCE:
        kept = "kept in float32" if region.forward_gap <= _tolerance(low) else "changed"
        found.append(
            Mismatch(
                FORWARD,
                f"rounded to {_short(low)} first",
                f"{kept}: the region's output off eager's arithmetic by {region.forward_gap:.3g}",
                backend,
            )
        )
    if region.backward_gap > FP32_TOLERANCE:
        ran = f"in {_short(low)}" if region.backward_gap <= _tolerance(low) else "otherwise"
        found.append(
            Mismatch(
                BACKWARD, "in float32", f"{ran}: off float32 by {region.backward_gap:.3g}", backend
            )
        )
    return found


def _mixed_operands(x: torch.Tensor, layer: nn.Linear, weight: torch.Tensor) -> torch.Tensor:
    """A float32 operand given the region's low-precision input without .float(): a batched
    matmul of a bfloat16 (float16) tensor and a float32 one."""
    h = layer(x)
    with torch.autocast(x.device.type, enabled=False):
        return torch.matmul(h, weight)


@torch_compile.denormals_kept()  # torch 2.4's inductor kernels turn flush-to-zero on
def _mixed_outcome(amp_device, low, backend: str | None) -> str:
    """What the mixed-dtype matmul gives: its output dtype, or "raises" and what."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        layer = nn.Linear(WIDTH, WIDTH).to(amp_device.torch_device)
        weight = torch.randn(BATCH, WIDTH, WIDTH).to(amp_device.torch_device)
    call = _mixed_operands if backend is None else torch_compile.fresh(_mixed_operands, backend)
    try:
        with torch.no_grad(), torch.autocast(amp_device.type, dtype=low):
            return _short(call(_batch(amp_device), layer, weight).dtype)
    except Exception as exc:  # eager's RuntimeError; compiled, the same, or at compile time
        return f"raises ({torch_compile.error_line(exc)})"


def _mixed_predicted(backend: str | None) -> str:
    """Eager and aot_eager raise on the mixed dtypes; inductor before 2.12 computes float32."""
    if backend == "inductor" and _before(CHECKS_MIXED_BMM, releases.ANY_DEVICE):
        return "float32"
    return "raises"


@pytest.mark.claim("CMP-DISABLED-REGION")
@pytest.mark.parametrize("low", LOW_DTYPES)
def test_disabled_region_computes_in_float32(record, amp_device, low):
    backends, left_out = _arms(amp_device)
    block, x = _block(amp_device), _batch(amp_device)
    regions = {b: _region(_run(amp_device, low, b), block, x) for b in backends}
    arms = {b: _region_mismatches(region, low, b) for b, region in regions.items()}
    mixed = {b: _mixed_outcome(amp_device, low, b) for b in (None, *backends)}
    for backend in backends:
        if mixed[backend].split()[0] != mixed[None].split()[0]:
            subject = "a float32 operand given the region's low-precision input"
            arms[backend].append(Mismatch(subject, mixed[None], mixed[backend], backend))
    # Each mismatch re-measured with the setting that should restore eager's: AOTAutograd's
    # where AOTAutograd alone runs (aot_eager), inductor's rounding mode on inductor.
    settings = {}
    for backend, setting, about in (
        ("aot_eager", torch_compile.BACKWARD_OUTSIDE_AUTOCAST, BACKWARD),
        ("inductor", torch_compile.EAGER_ROUNDING, FORWARD),
    ):
        if any(m.subject == about for m in arms.get(backend, [])):
            settings[setting.name] = _with_setting(
                amp_device, low, backend, setting,
                lambda run, b=backend: _region_mismatches(_region(run, block, x), low, b), about,
                backward=about == BACKWARD,
            )  # fmt: skip
    # Negative control: eager's own region, held to the same float32 references: within
    # float32's tolerance, so that a low-precision backward or a lost rounding shows.
    eager_region = _region(_run(amp_device, low), block, x)
    eager_found = _region_mismatches(eager_region, low, "eager")

    record.param(
        autocast_dtype=_short(low),
        backends=",".join(backends),
        **{f"mixed_operands/{b or 'eager'}": outcome for b, outcome in mixed.items()},
    )
    record.metric(**{"backward_gap/eager": eager_region.backward_gap})
    for backend, region in regions.items():
        record.metric(**{f"forward_gap/{backend}": region.forward_gap})
        record.metric(**{f"backward_gap/{backend}": region.backward_gap})
        float32_backward = int(region.backward_gap <= FP32_TOLERANCE)
        record.key_metric(**{f"float32_backward/{backend}": float32_backward})
    _uncompiled(record, errors := {b: r.error for b, r in regions.items()})
    record.verdict(
        "CMP-DISABLED-REGION",
        _verdict(record, {b: bool(found) for b, found in arms.items()}, errors),
        f"{_short(low)} autocast on {amp_device.type}, an autocast(enabled=False) region in the "
        f"compiled block, forward and backward held to float32 arithmetic on each run's own "
        f"inputs (tolerance {FP32_TOLERANCE:.3g}): eager off by {eager_region.forward_gap:.3g} "
        f"forward and {eager_region.backward_gap:.3g} backward; "
        + "; ".join(
            f"{b}: raised {r.error}"
            if r.error
            else f"{b}: forward {r.forward_gap:.3g}, backward {r.backward_gap:.3g}"
            for b, r in regions.items()
        )
        + "; a float32 operand given the region's low-precision input: "
        + ", ".join(f"{b or 'eager'} {outcome}" for b, outcome in mixed.items())
        + ". Mismatches: "
        + _named([m for found in arms.values() for m in found])
        + "".join(f"; with {text}" for text in settings.values())
        + "."
        + left_out,
    )
    wrong = [_region_unpredicted(amp_device, low, b, r, mixed[b]) for b, r in regions.items()]
    restored = settings.get(torch_compile.BACKWARD_OUTSIDE_AUTOCAST.name, "as eager")
    if torch_compile.BACKWARD_OUTSIDE_AUTOCAST.available() and not restored.endswith("as eager"):
        wrong.append(f"aot_eager: predicted {restored} to restore eager's float32 backward")
    assert not any(wrong), "CMP-DISABLED-REGION: " + "; ".join(filter(None, wrong))
    assert not eager_found and mixed[None].startswith("raises"), (
        f"CMP-DISABLED-REGION: control: predicted eager's region in float32 and eager raising "
        f"on the mixed operands, got {_named(eager_found)}, {mixed[None]}"
    )


def _region_unpredicted(amp_device, low, backend: str, region: Region, mixed: str) -> str | None:
    """How a compiled arm's region differs from the prediction: float32 outputs; a backward in
    the low dtype (AOTAutograd's default, documented in "torch.compile has different autograd
    semantics": the backward traced under the forward's autocast); a forward within the low
    dtype's rounding of eager's arithmetic; the mixed operands as _mixed_predicted says; the
    raise predicted on 2.5.1's inductor."""
    if region.error or _predicted_error(amp_device, backend):
        return _raise_as_predicted(amp_device, backend, region.error)
    problems = []
    if region.graph != low:
        if not _may_serve_other(backend):
            problems.append(f"its own dtype's graph, got {_short(region.graph)}'s")
        low = region.graph  # the other dtype's graph, predicted here: held to that dtype
    if region.dtypes != (F32, F32):
        problems.append(f"float32 region outputs, got {', '.join(map(_short, region.dtypes))}")
    if not FP32_TOLERANCE < region.backward_gap <= _tolerance(low):
        problems.append(
            f"a backward in {_short(low)} (off float32 by more than {FP32_TOLERANCE:.3g} and "
            f"at most {_tolerance(low):.3g}), got {region.backward_gap:.3g}"
        )
    if region.forward_gap > _tolerance(low):
        problems.append(f"a forward within {_short(low)}'s rounding, got {region.forward_gap}")
    if not mixed.startswith(_mixed_predicted(backend)):
        problems.append(f"the mixed operands: {_mixed_predicted(backend)}, got {mixed}")
    return f"{backend}: predicted " + "; ".join(problems) if problems else None


# --- CMP-DTYPE-SWITCH ----------------------------------------------------------------------------

SWITCH = (BF16, F16, BF16)  # the dtypes the block compiled once is called under, in order


@pytest.mark.claim("CMP-DTYPE-SWITCH")
@pytest.mark.requires("bf16_autocast", "fp16_autocast")
def test_dtype_switch_recompiles(record, amp_device):
    backends, left_out = _arms(amp_device)
    eager = _run(amp_device, F16)
    new_graphs, runs = {}, {}
    for backend in backends:
        model, x = _block(amp_device), _batch(amp_device)
        call = torch_compile.fresh(model, backend)
        counts = [torch_compile.graphs_compiled()]
        runs[backend] = []
        for low in SWITCH:
            runs[backend].append(_attempt(partial(_forward_backward, model, call, x, low,
                                                  amp_device)))  # fmt: skip
            counts.append(torch_compile.graphs_compiled())
        new_graphs[backend] = [
            after - before for before, after in zip(counts, counts[1:], strict=False)
        ]
    arms = {
        b: _block_mismatches(eager, runs[b][1], F16, b, _switch_cause(new_graphs[b][1]))
        for b in backends
    }

    record.param(backends=",".join(backends), order=", ".join(map(_short, SWITCH)))
    record.key_metric(**{f"recompiled_on_switch/{b}": new[1] for b, new in new_graphs.items()})
    _uncompiled(record, errors := {b: runs[b][1].error for b in backends})
    record.verdict(
        "CMP-DTYPE-SWITCH",
        _verdict(record, {b: bool(found) for b, found in arms.items()}, errors),
        f"the block compiled once on {amp_device.type} and called under "
        f"{', '.join(map(_short, SWITCH))} autocast: "
        + "; ".join(
            f"{b}: {'/'.join(map(str, new_graphs[b]))} new graphs, the float16 call against "
            f"eager's float16: {len(found)} mismatches {_named(found)}"
            for b, found in arms.items()
        )
        + "."
        + left_out,
    )
    wrong = [
        _switch_unpredicted(amp_device, b, new_graphs[b], runs[b], found)
        for b, found in arms.items()
    ]
    assert not any(wrong), "CMP-DTYPE-SWITCH: " + "; ".join(filter(None, wrong))
    for backend, new in new_graphs.items():
        if _predicted_error(amp_device, backend):
            continue
        # Negative control: the third call, bfloat16 again, finds its graph: no recompile, so
        # that the count tells a reused graph from a new one; and it computes in bfloat16.
        back = {runs[backend][2].outputs[name].dtype for name in COMPUTED_LOW}
        assert new[2] == 0 and back == {BF16}, (
            f"CMP-DTYPE-SWITCH: {backend}: control: predicted no recompile back to bfloat16 "
            f"and bfloat16 outputs, got {new} new graphs, {back}"
        )


def _switch_unpredicted(amp_device, backend, new: list[int], runs: list[Run], mismatches):
    """How the switch differs from the prediction: a recompile and float16's behaviour from
    2.7 on (GUARDS_AUTOCAST); before, bfloat16's graph reused (no new graph,
    bfloat16 outputs); the raise predicted on 2.5.1's inductor."""
    if runs[1].error or _predicted_error(amp_device, backend):
        return _raise_as_predicted(amp_device, backend, runs[1].error)
    if not _before(GUARDS_AUTOCAST, releases.ANY_DEVICE):
        if new[1] >= 1:
            return _unpredicted(amp_device, backend, mismatches)
        return (
            f"{backend}: predicted a recompile and float16's behaviour, got {new} new graphs, "
            f"{_named(mismatches)}"
        )
    reused = {runs[1].outputs[name].dtype for name in COMPUTED_LOW}
    if new[1] == 0 and reused == {BF16}:
        return None
    return (
        f"{backend}: predicted bfloat16's graph reused on torch {torch.__version__} (no "
        f"autocast guard before 2.7, pytorch/pytorch#112260), got {new} new graphs and "
        f"outputs {sorted(map(_short, reused))}"
    )


# --- CMP-WEIGHT-CACHE ----------------------------------------------------------------------------

STEPS, LR = 3, 0.1  # two updates for a later forward to see; 0.1 moves weights by far more
# than bfloat16's spacing


@dataclass(frozen=True)
class Loop:
    """The forwards of a loop inside one autocast region against fresh ones."""

    updates: int  # forwards after an update
    fresh: int  # of those, bit-identical to the same callable run afresh on that step's weights
    stale: int  # of those, bit-identical to the forward before though the weights changed
    error: str = ""

    @property
    def sees_updates(self) -> bool:
        return not self.error and self.fresh == self.updates and self.stale == 0

    def __str__(self) -> str:
        if self.error:
            return f"raised {self.error}"
        return f"{self.fresh} of {self.updates} later forwards saw the update, {self.stale} stale"


@torch_compile.denormals_kept()  # torch 2.4's inductor kernels turn flush-to-zero on
def _long_region(amp_device, low, backend: str | None) -> Loop:
    """STEPS SGD steps of the block, compiled with `backend` (eager where None), inside one
    autocast region; each forward's "linear" output (the op whose weight eager's autocast
    caches a cast of) against the same callable run afresh, in a region of its own, on the
    weights of its step."""
    model, x = _block(amp_device), _leaf(_batch(amp_device))
    call = model if backend is None else torch_compile.fresh(model, backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    outputs, weights = [], []
    try:
        with torch.autocast(amp_device.type, dtype=low):
            for _ in range(STEPS):
                weights.append(copy.deepcopy(model.state_dict()))
                out = call(x)
                outputs.append(out["linear"].detach().clone())
                optimizer.zero_grad()
                _loss(out).backward()
                optimizer.step()
        fresh = []
        for state in weights:
            model.load_state_dict(state)
            with torch.autocast(amp_device.type, dtype=low):
                fresh.append(call(x)["linear"].detach().clone())
    except Exception as exc:  # a compile that fails (2.5.1's inductor) is what was measured
        return Loop(0, 0, 0, torch_compile.error_line(exc))
    later = list(zip(outputs[1:], fresh[1:], outputs[:-1], strict=True))
    return Loop(
        len(later),
        sum(torch.equal(out, new) for out, new, _ in later),
        sum(torch.equal(out, before) for out, _, before in later),
    )


@pytest.mark.claim("CMP-WEIGHT-CACHE")
@pytest.mark.parametrize("low", LOW_DTYPES)
def test_compiled_loop_in_one_region_sees_each_update(record, amp_device, low):
    backends, left_out = _arms(amp_device)
    loops = {backend: _long_region(amp_device, low, backend) for backend in backends}
    # Negative control: eager in the same region forwards the first step's cached casts
    # (scenarios/test_autocast_shapes.py): the measurement tells stale forwards from fresh.
    eager = _long_region(amp_device, low, None)

    record.param(autocast_dtype=_short(low), steps=STEPS, lr=LR, backends=",".join(backends))
    record.key_metric(**{f"sees_updates/{b}": int(loop.sees_updates) for b, loop in loops.items()})
    record.key_metric(**{"sees_updates/eager": int(eager.sees_updates)})
    _uncompiled(record, errors := {b: loop.error for b, loop in loops.items()})
    record.verdict(
        "CMP-WEIGHT-CACHE",
        _verdict(record, {b: not loop.sees_updates for b, loop in loops.items()}, errors),
        f"{_short(low)} autocast on {amp_device.type}, the block trained {STEPS} SGD steps "
        f"(lr {LR}) inside one autocast region: "
        + "; ".join(f"{b}: {loop}" for b, loop in loops.items())
        + f"; control, eager: {eager}."
        + left_out,
    )
    wrong = [
        _raise_as_predicted(amp_device, b, loop.error)
        if loop.error or _predicted_error(amp_device, b)
        else None
        if loop.sees_updates
        else f"{b}: predicted each step's weights seen, got {loop}"
        for b, loop in loops.items()
    ]
    assert not any(wrong), "CMP-WEIGHT-CACHE: " + "; ".join(filter(None, wrong))
    assert eager.fresh == 0 and eager.stale == eager.updates, (
        f"CMP-WEIGHT-CACHE: control: predicted every later eager forward stale, got {eager}"
    )


# --- CMP-SCALER-SKIP -----------------------------------------------------------------------------

# Each case's loss scale: a clean step at 2**10; at 2**40 float16's backward overflows; a NaN in
# the batch makes every gradient NaN.
SCALER_CASES = {"clean": 2.0**10, "inf": 2.0**40, "nan": 2.0**10}


@dataclass(frozen=True)
class ScaledStep:
    skipped: bool  # no weight moved
    scale: float  # the scale after update()
    nonfinite: int  # gradient entries that are inf or NaN
    error: str = ""
    graph: torch.dtype = F16  # the dtype the forward computed in

    def __str__(self) -> str:
        if self.error:
            return f"raised {self.error}"
        took = "skipped" if self.skipped else "stepped"
        other = f", ran {_short(self.graph)}'s graph" if self.graph != F16 else ""
        return (
            f"{took} ({self.nonfinite} non-finite gradient entries, scale to {self.scale:g}{other})"
        )


@torch_compile.denormals_kept()  # torch 2.4's inductor kernels turn flush-to-zero on
def _scaled_steps(amp_device, backend: str | None) -> dict[str, ScaledStep]:
    """One torch.amp.GradScaler step of the block under float16 autocast per SCALER_CASES
    case, each from the same weights, compiled once with `backend` (eager where None)."""
    model, clean = _block(amp_device), _batch(amp_device)
    initial = copy.deepcopy(model.state_dict())
    call = model if backend is None else torch_compile.fresh(model, backend)
    steps = {}
    for case, init_scale in SCALER_CASES.items():
        model.load_state_dict(initial)
        x = clean.clone()
        if case == "nan":
            x[0, 0, 0] = float("nan")
        x = _leaf(x)
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        scaler = torch.amp.GradScaler(amp_device.type, init_scale=init_scale)
        try:
            with torch.autocast(amp_device.type, dtype=F16):
                outputs = call(x)
                loss = _loss(outputs)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
        except Exception as exc:  # a compile that fails (2.5.1's inductor) is what was measured
            steps[case] = ScaledStep(False, init_scale, 0, torch_compile.error_line(exc))
            continue
        nonfinite = sum(int((~torch.isfinite(p.grad)).sum()) for p in model.parameters())
        scaler.step(optimizer)
        scaler.update()
        after = model.state_dict()
        moved = any(not torch.equal(after[name], value) for name, value in initial.items())
        graph = outputs["linear"].dtype
        steps[case] = ScaledStep(not moved, scaler.get_scale(), nonfinite, graph=graph)
    return steps


def _scaler_wrong(steps: dict[str, ScaledStep]) -> list[str]:
    """The cases where GradScaler's rule did not hold: skip and halve the scale where the
    gradients hold inf or NaN, step and keep it where they are finite."""
    wrong = []
    for case, init_scale in SCALER_CASES.items():
        step, overflow = steps[case], case != "clean"
        predicted = (overflow, init_scale / 2 if overflow else init_scale, overflow)
        if step.error or (step.skipped, step.scale, step.nonfinite > 0) != predicted:
            wrong.append(case)
    return wrong


@pytest.mark.claim("CMP-SCALER-SKIP")
@pytest.mark.requires("fp16_autocast", "grad_scaler")
def test_grad_scaler_skips_a_compiled_overflow(record, amp_device):
    backends, left_out = _arms(amp_device)
    arms = {backend: _scaled_steps(amp_device, backend) for backend in backends}
    # Negative control: eager's clean step is taken and its overflows skipped, read from the
    # weights, which a step moves: the same reading tells a skip from a step.
    eager = _scaled_steps(amp_device, None)

    def described(steps: dict[str, ScaledStep]) -> str:
        return ", ".join(f"{case} {step}" for case, step in steps.items())

    record.param(
        backends=",".join(backends), **{f"init_scale/{c}": s for c, s in SCALER_CASES.items()}
    )
    for arm, steps in {"eager": eager, **arms}.items():
        record.key_metric(**{f"skipped/{arm}/{c}": int(s.skipped) for c, s in steps.items()})
    errors = {b: " / ".join(sorted({s.error for s in steps.values() if s.error}))
              for b, steps in arms.items()}  # fmt: skip
    _uncompiled(record, errors)
    record.verdict(
        "CMP-SCALER-SKIP",
        _verdict(record, {b: bool(_scaler_wrong(steps)) for b, steps in arms.items()}, errors),
        f"one torch.amp.GradScaler({amp_device.type!r}) step of the block under float16 "
        f"autocast from the same weights, the scale {SCALER_CASES['clean']:g} (clean, nan) or "
        f"{SCALER_CASES['inf']:g} (inf): eager: {described(eager)}; "
        + "; ".join(f"{b}: {described(steps)}" for b, steps in arms.items())
        + "."
        + left_out,
    )
    wrong = []
    for backend, steps in arms.items():
        errors = {step.error for step in steps.values() if step.error}
        # Where the cache may serve bfloat16's graph (_may_serve_other), a float16 overflow
        # does not happen in it: that case's step is predicted.
        unexplained = [
            case
            for case in _scaler_wrong(steps)
            if not (steps[case].graph == BF16 and _may_serve_other(backend))
        ]
        if errors or _predicted_error(amp_device, backend):
            wrong.append(_raise_as_predicted(amp_device, backend, " / ".join(sorted(errors))))
        elif unexplained:
            wrong.append(f"{backend}: " + "; ".join(f"{c}: {steps[c]}" for c in unexplained))
    assert not any(wrong), (
        "CMP-SCALER-SKIP: predicted a skip and the scale halved on inf and NaN, a step on "
        "finite gradients: " + "; ".join(filter(None, wrong))
    )
    assert not _scaler_wrong(eager), f"CMP-SCALER-SKIP: control: eager {described(eager)}"


# --- CMP-DYNAMIC-SHAPES --------------------------------------------------------------------------

SHAPES = ((BATCH, SEQ, WIDTH), (BATCH + 1, SEQ + 2, WIDTH))
# One dtype: dynamic shapes make tracing several times slower, and the dtypes themselves are
# CMP-BLOCK-DTYPES's; bfloat16 is the CPU's autocast default.
DYNAMIC_DTYPE = BF16


@pytest.mark.claim("CMP-DYNAMIC-SHAPES")
@pytest.mark.requires("bf16_autocast")
def test_dynamic_shapes_keep_eager_dtypes(record, amp_device):
    low = DYNAMIC_DTYPE
    backends, left_out = _arms(amp_device)
    batches = [_batch(amp_device, seed, shape) for seed, shape in enumerate(SHAPES)]
    eager = []
    for x in batches:
        model = _block(amp_device)
        eager.append(_forward_backward(model, model, x, low, amp_device))
    arms, graphs = {}, {}
    for backend in backends:
        model = _block(amp_device)
        call = torch_compile.fresh(model, backend, dynamic=True)
        start, arms[backend] = torch_compile.graphs_compiled(), []
        for x, reference in zip(batches, eager, strict=True):
            run = _attempt(partial(_forward_backward, model, call, x, low, amp_device))
            arms[backend] += [
                Mismatch(f"{m.subject} at {tuple(x.shape)}", m.eager, m.compiled, backend)
                for m in _block_mismatches(reference, run, low, backend)
            ]
        graphs[backend] = torch_compile.graphs_compiled() - start
    # Negative control: the second shape's eager run held to the first shape's: the comparison
    # sees the shapes differ, so that it is not blind to a run of the wrong shape.
    control = _shape_mismatches(eager[0], eager[1])

    record.param(autocast_dtype=_short(low), shapes=str(SHAPES), backends=",".join(backends))
    record.metric(**{f"graphs/{backend}": count for backend, count in graphs.items()})
    record.key_metric(**{f"mismatches/{backend}": len(found) for backend, found in arms.items()})
    _uncompiled(record, errors := _raised_in(arms))
    record.verdict(
        "CMP-DYNAMIC-SHAPES",
        _verdict(record, {b: bool(found) for b, found in arms.items()}, errors),
        f"{_short(low)} autocast on {amp_device.type}, the block compiled with dynamic=True and "
        f"run at {SHAPES[0]} then {SHAPES[1]}: "
        + "; ".join(
            f"{b}: {graphs[b]} graph(s), {len(found)} mismatches {_named(found)}"
            for b, found in arms.items()
        )
        + f"; control, the two shapes' eager outputs: {len(control)} of "
        f"{len(eager[0].outputs)} differ in shape." + left_out,
    )
    wrong = [_unpredicted(amp_device, b, found, dynamic=True) for b, found in arms.items()]
    assert not any(wrong), "CMP-DYNAMIC-SHAPES: " + "; ".join(filter(None, wrong))
    assert len(control) == len(eager[0].outputs), (
        f"CMP-DYNAMIC-SHAPES: control: predicted every output's shape to differ between "
        f"{SHAPES[0]} and {SHAPES[1]}, got {control}"
    )


def _shape_mismatches(first: Run, second: Run) -> list[str]:
    return [name for name, out in first.outputs.items() if out.shape != second.outputs[name].shape]


# --- CMP-LOSS-CURVE ------------------------------------------------------------------------------

# fp32 trained on ORDERS orders of the same batches: its spread is what a rerun on reshuffled
# data moves the curve by. One dtype, bfloat16 (the CPU's autocast default): a curve's
# closeness, not dtypes, is the claim.
LOOP_STEPS, LOOP_LR, ORDERS, CURVE_DTYPE = 8, 0.05, 3, BF16


@torch_compile.denormals_kept()  # torch 2.4's inductor kernels turn flush-to-zero on
def _curve(amp_device, low, backend: str | None, order: int, lr: float = LOOP_LR) -> list[float]:
    """The block trained LOOP_STEPS AdamW steps (under `low` autocast, or float32 where None;
    its forward compiled with `backend` where given) on the batches in `order` (0: as drawn;
    else a seeded shuffle): after each step, its loss on a held-out batch, computed the same
    way for every run (eager, float32), so that curves differ only where the training did."""
    model = _block(amp_device)
    call = model if backend is None else torch_compile.fresh(model, backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    batches = [_batch(amp_device, 100 + step) for step in range(LOOP_STEPS)]
    if order:
        turn = torch.randperm(LOOP_STEPS, generator=torch.Generator().manual_seed(order))
        batches = [batches[i] for i in turn.tolist()]
    held_out, curve = _batch(amp_device, 99), []
    for x in batches:
        with torch.autocast(amp_device.type, dtype=low or F32, enabled=low is not None):
            loss = _loss(call(_leaf(x)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            curve.append(float(_loss(model(held_out))))
    return curve


def _outside(gaps: list[float], spread: list[float]) -> list[int]:
    """The steps (from 1) where a curve is further from eager's than fp32's runs are apart."""
    return [step for step, (g, s) in enumerate(zip(gaps, spread, strict=True), 1) if g > s]


def _floats(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.3g}" for v in values) + "]"


@pytest.mark.claim("CMP-LOSS-CURVE")
@pytest.mark.requires("bf16_autocast")
def test_compiled_training_follows_eager(record, amp_device):
    low = CURVE_DTYPE
    backends, left_out = _arms(amp_device)
    fp32 = [_curve(amp_device, None, None, order) for order in range(ORDERS)]
    spread = [max(step) - min(step) for step in zip(*fp32, strict=True)]
    eager = _curve(amp_device, low, None, 0)
    curves, errors = {}, {}
    for backend in backends:
        try:
            curves[backend] = _curve(amp_device, low, backend, 0)
        except Exception as exc:  # a compile that fails (2.5.1's inductor) is what was measured
            errors[backend] = torch_compile.error_line(exc)
    gaps = {b: [abs(c - e) for c, e in zip(curve, eager, strict=True)] for b, curve in
            curves.items()}  # fmt: skip
    outside = {b: _outside(gap, spread) for b, gap in gaps.items()}
    # Negative control: a run that did not train (lr 0) is far outside the spread: the
    # comparison tells a curve that leaves eager's from one that follows it.
    flat = _curve(amp_device, low, None, 0, lr=0.0)
    flat_gap = [abs(f - e) for f, e in zip(flat, eager, strict=True)]

    decidable = min(spread) > 0  # fp32's runs apart at every step: a spread to compare with
    record.param(autocast_dtype=_short(low), steps=LOOP_STEPS, lr=LOOP_LR, orders=ORDERS,
                 backends=",".join(backends))  # fmt: skip
    record.history(prefix="fp32/", loss=fp32[0])
    record.history(prefix="fp32_spread/", loss=spread)
    record.history(prefix="eager/", loss=eager)
    for backend, curve in curves.items():
        record.history(prefix=f"{backend}/", loss=curve)
        ratio = max(g / s for g, s in zip(gaps[backend], spread, strict=True)) if decidable else -1
        record.metric(**{f"gap_over_spread/{backend}": ratio})
        # Which way it went, for the ledger: a count of steps, not a distance.
        record.key_metric(**{f"steps_outside_spread/{backend}": len(outside[backend])})
    failed = {b: bool(outside.get(b, True)) for b in backends}
    verdict = _verdict(record, failed, errors)
    if not decidable and any(not errors.get(b) for b in backends):  # some arm compiled
        verdict = "inconclusive"
    _uncompiled(record, {b: errors.get(b, "") for b in backends})
    record.verdict(
        "CMP-LOSS-CURVE",
        verdict,
        f"{_short(low)} autocast on {amp_device.type}, the block trained {LOOP_STEPS} AdamW "
        f"steps (lr {LOOP_LR}), its held-out loss after each: fp32's spread over {ORDERS} "
        f"batch orders {_floats(spread)}; eager {_floats(eager)}; "
        + "; ".join(
            f"{b}: raised {errors[b]}"
            if b in errors
            else f"{b}: off eager by {_floats(gaps[b])}, outside the spread at "
            f"{len(outside[b])} of {LOOP_STEPS} steps"
            for b in backends
        )
        + f"; control, lr 0: off eager by up to {max(flat_gap):.3g}"
        + ("" if decidable else "; fp32's runs did not spread at every step: undecided")
        + "."
        + left_out,
    )
    wrong = []
    for backend in backends:
        if backend in errors or _predicted_error(amp_device, backend):
            wrong.append(_raise_as_predicted(amp_device, backend, errors.get(backend, "")))
        elif decidable and outside[backend]:
            wrong.append(f"{backend}: outside fp32's spread at steps {outside[backend]}")
    assert not any(wrong), "CMP-LOSS-CURVE: predicted within fp32's spread: " + "; ".join(
        filter(None, wrong)
    )
    assert decidable and flat_gap[-1] > spread[-1], (
        f"CMP-LOSS-CURVE: control: predicted fp32's runs apart at every step and an untrained "
        f"run outside their spread at the last, got the spread {_floats(spread)} and the "
        f"untrained run off by {flat_gap[-1]:.3g}"
    )
