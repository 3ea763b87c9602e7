"""Known bugs of torch.compile against eager under mixed precision (the compiled parity class)."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from harness.lab.autocast import torch_compile
from harness.lab.autocast.scaled_loop import scaled_training
from harness.lab.known_bugs.reproduction import Observed, Unavailable, reproduces

F16, BF16 = torch.float16, torch.bfloat16


def _autocast_available(device: torch.device, dtype: torch.dtype) -> None:
    try:
        with torch.autocast(device.type, dtype=dtype):
            pass
    except (RuntimeError, AssertionError) as error:
        raise Unavailable(f"{dtype} autocast on {device.type}: {error}") from None


# --- the backward of an autocast(enabled=False) region ------------------------------------------


_STEPS = 4


@contextlib.contextmanager
def _arm(fn: Callable, control: bool, backend: str = "inductor") -> Iterator[tuple[Callable, str]]:
    """The two paths of a parity reproduction: `fn` run eagerly (the control), or compiled
    afresh with `backend` into a fresh inductor cache (nothing compiled before, under another
    CPU class or release, is served); with the arm's name for the evidence. Flush-to-zero is
    kept as it was (2.4's inductor kernels turn it on for the whole process)."""
    with torch_compile.fresh_cache_dir(), torch_compile.denormals_kept():
        yield (fn, "eager") if control else (torch_compile.fresh(fn, backend), backend)


def _mixed_dtypes(op: Callable, what: str, a: torch.Tensor, b: torch.Tensor, control: bool):
    """`op(a, b)` with a bf16 `a` and an fp32 `b` (a cast forgotten at the edge of a
    mixed-precision region), which eager refuses: does the run go through, and in which dtype."""
    with _arm(lambda p, q: op(p, q), control) as (call, arm):
        try:
            out = call(a, b)
            gap = float((out.float() - op(a.float(), b)).abs().max())
            result, accepted = f"runs, returning {out.dtype} {gap:.3g} off the fp32 result", True
        except Exception as exc:  # eager's RuntimeError; inductor's compile-time refusal
            result, accepted = f"raises {torch_compile.error_line(exc)}", False
    return Observed(
        harm=accepted,
        says=f"{what} under {arm}: {int(accepted)} of 1 calls accepted; it {result}",
        numbers={"accepted": float(accepted)},
    )


@reproduces(
    "KB-COMPILE-BWD-AUTOCAST-DISABLED-REGION",
    devices=("cpu", "cuda"),
    control=(
        "the same loop compiled with torch._functorch.config.backward_pass_autocast='off' where "
        "the release has it (2.9 on), run eagerly where it does not"
    ),
    slow=True,
)
def compiled_backward_of_disabled_region(device: torch.device, control: bool) -> Observed:
    _autocast_available(device, F16)
    setting = torch_compile.BACKWARD_OUTSIDE_AUTOCAST
    if control and not setting.available():
        arm, compiled, setting = "eager", False, None
    elif control:
        arm, compiled = f"compiled with {setting.label}", True
    else:
        arm, compiled, setting = "compiled (aot_eager)", True, None
    history = scaled_training(device, "aot_eager" if compiled else None, setting, _STEPS)
    skipped, moved = history.steps_skipped, history.moved
    return Observed(
        harm=skipped > 0,
        says=(
            f"{arm}: a float32 Linear inside autocast(enabled=False), fed float16 activations of "
            f"4.0, trained {_STEPS} steps under fp16 autocast with GradScaler at 65536: "
            f"{skipped} of {_STEPS} steps skipped on an inf gradient, the weight moved by "
            f"{moved:.3g}"
        ),
        numbers={"skipped_steps": float(skipped), "weight_moved": moved},
    )


# --- dynamo's guard on the ambient autocast dtype -------------------------------------------------


@reproduces(
    "KB-DYNAMO-AMBIENT-AUTOCAST-GUARD",
    devices=("cpu", "cuda"),
    control="the same calls with torch._dynamo.reset() before the call under float16",
    slow=True,
)
def dynamo_ambient_autocast_guard(device: torch.device, control: bool) -> Observed:
    """A Linear compiled (aot_eager) and called under bf16 autocast, then called under fp16
    autocast, its output held to eager's under fp16."""
    _autocast_available(device, F16)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        layer = nn.Linear(16, 16).to(device)
        x = torch.randn(8, 16, device=device)
    call = torch_compile.fresh(layer, "aot_eager")
    with torch.no_grad():
        with torch.autocast(device.type, dtype=BF16):
            call(x)
        if control:
            torch._dynamo.reset()
        with torch.autocast(device.type, dtype=F16):
            got, eager = call(x), layer(x)
    gap = float((got.float() - eager.float()).abs().max())
    return Observed(
        harm=got.dtype != F16,
        says=(
            f"a Linear compiled under bf16 autocast, then called under fp16 autocast"
            f"{' after a reset' if control else ''}, returns {got.dtype} (eager: {eager.dtype}), "
            f"off eager's fp16 output by up to {gap:.3g}"
        ),
        numbers={"output_is_fp16": float(got.dtype == F16), "gap_to_eager": gap},
    )


# --- inductor's CPU kernels and flush-to-zero ----------------------------------------------------

_compiles = itertools.count()  # a new constant each call: a kernel not loaded before


@reproduces(
    "KB-INDUCTOR-FTZ-DENORMALS",
    devices=("cpu",),
    control="the same eager arithmetic with the function run eagerly instead of compiled",
    slow=True,
)
def inductor_flushes_denormals(device: torch.device, control: bool) -> Observed:
    """An fp32 subnormal (1.1e-38 times 0.75, as a small master weight or Adam state can be)
    computed eagerly before and after one call of an inductor-compiled function."""
    tiny = torch.full((4,), 2.0**-126, device=device)

    def subnormal() -> float:
        return float((tiny * 0.75).min())

    offset = float(next(_compiles) % 1000) / 1024

    def step(a: torch.Tensor) -> torch.Tensor:
        return a * 2.0 + offset

    with torch_compile.denormals_kept():
        before = subnormal()
        call = step if control else torch_compile.fresh(step, "inductor")
        call(torch.randn(16, device=device))
        after = subnormal()
    arm = "eager" if control else "an inductor-compiled"
    return Observed(
        harm=before != 0.0 and after == 0.0,
        says=(
            f"0.75 * 2**-126 in eager fp32 gives {before:.3g} before and {after:.3g} after "
            f"calling {arm} function once"
        ),
        numbers={"before": before, "after": after},
    )


# --- inductor and a bmm of mixed dtypes ----------------------------------------------------------


@reproduces(
    "KB-INDUCTOR-MIXED-BMM-ACCEPTED",
    devices=("cpu", "cuda"),
    control="the same call run eagerly",
    slow=True,
)
def inductor_mixed_bmm(device: torch.device, control: bool) -> Observed:
    """A bf16 activation multiplied by an fp32 weight with bmm (a cast forgotten at the edge of
    a mixed-precision region): eager refuses it; does the run go through, and in which dtype."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(2, 4, 8, generator=generator).to(device, BF16)
    b = torch.randn(2, 8, 4, generator=generator).to(device)
    return _mixed_dtypes(torch.bmm, "torch.bmm(bf16, fp32)", a, b, control)


# --- multilabel_margin_loss's decomposition ------------------------------------------------------


def _multilabel_margin_reference(x: torch.Tensor, target: torch.Tensor) -> float:
    """The documented loss: per row, the targets up to the first -1; sum over target j and
    non-target i of max(0, 1 - (x[j] - x[i])) / C; the mean over rows."""
    total = 0.0
    for row, labels in zip(x.tolist(), target.tolist(), strict=True):
        taken = list(itertools.takewhile(lambda label: label >= 0, labels))
        others = [i for i in range(len(row)) if i not in taken]
        total += sum(max(0.0, 1 - (row[j] - row[i])) for j in taken for i in others) / len(row)
    return total / len(x)


@reproduces(
    "KB-MULTILABEL-MARGIN-DECOMP",
    devices=("cpu", "cuda"),
    control="the same loss run eagerly",
    slow=True,
)
def multilabel_margin_decomposition(device: torch.device, control: bool) -> Observed:
    """multilabel_margin_loss (an fp32 loss under bf16 autocast) on targets padded with -1,
    held to the loss its documentation defines."""
    x = torch.tensor([[0.1, 0.2, 0.4, 0.8], [0.5, 0.3, 0.2, 0.9]], device=device)
    target = torch.tensor([[0, 2, -1, 0], [1, -1, 0, 0]], device=device)

    def loss(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.multilabel_margin_loss(scores, labels)

    with _arm(loss, control, "aot_eager") as (call, arm), torch.autocast(device.type, dtype=BF16):
        got = float(call(x, target))
    expected = _multilabel_margin_reference(x, target)
    return Observed(
        harm=abs(got - expected) > 1e-4,
        says=(
            f"multilabel_margin_loss {arm} under bf16 autocast with -1-padded targets: "
            f"{got:.5g}, where the documented loss is {expected:.5g}"
        ),
        numbers={"loss": got, "expected": expected},
    )


# --- inductor's lowering of binary_cross_entropy with a weight of another dtype -----------------


@reproduces(
    "KB-INDUCTOR-BCE-WEIGHT-DTYPE",
    devices=("cpu",),
    control="the same loss run eagerly",
    slow=True,
)
def inductor_bce_weight_dtype(device: torch.device, control: bool) -> Observed:
    """binary_cross_entropy of bf16 probabilities and targets with an fp32 per-element weight
    (a class weight kept in fp32 beside a bf16 model): eager returns the input's dtype."""
    generator = torch.Generator().manual_seed(0)
    probabilities = torch.rand(4, 8, generator=generator).clamp(0.05, 0.95).to(device, BF16)
    targets = (torch.rand(4, 8, generator=generator) > 0.5).to(device, BF16)
    weight = torch.rand(4, 8, generator=generator).to(device)

    def loss(p: torch.Tensor, t: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy(p, t, weight=w)

    expected = loss(probabilities, targets, weight)
    with _arm(loss, control) as (call, arm):
        got = call(probabilities, targets, weight)
    return Observed(
        harm=got.dtype != expected.dtype,
        says=(
            f"binary_cross_entropy(bf16, bf16, weight=fp32) under {arm} returns "
            f"{float(got):.6g} as {got.dtype} (eager: {float(expected):.6g} as {expected.dtype})"
        ),
        numbers={"same_dtype_as_eager": float(got.dtype == expected.dtype)},
    )


# --- inductor and an explicit low-precision round trip -------------------------------------------


@reproduces(
    "KB-INDUCTOR-CPU-LOWP-ROUNDTRIP-ELIDED",
    devices=("cpu",),
    control="the same function run eagerly",
    slow=True,
)
def inductor_roundtrip_elided(device: torch.device, control: bool) -> Observed:
    """x.to(float16).to(float32), the emulation of an fp16 tensor in fp32, and its row sums:
    are the values rounded to fp16 as the code asks."""

    def emulate(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x.to(F16).to(torch.float32)
        return y, y.sum(dim=1)

    x = (torch.arange(20, dtype=torch.float32).reshape(5, 4).t() / 7.0).to(device)
    expected = x.to(F16).to(torch.float32)
    with _arm(emulate, control) as (call, arm):
        rounded, sums = call(x)
    gap = float((rounded - expected).abs().max())
    sum_gap = float((sums - expected.sum(dim=1)).abs().max())
    return Observed(
        harm=gap > 0 or sum_gap > 1e-6,
        says=(
            f"x.to(float16).to(float32) under {arm}: values off their fp16 rounding by up to "
            f"{gap:.3g}, row sums by {sum_gap:.3g}"
        ),
        numbers={"rounding_gap": gap, "sum_gap": sum_gap},
    )


# --- inductor and an exact comparison after low-precision arithmetic -----------------------------


@reproduces(
    "KB-INDUCTOR-LOWP-COMPARE-ROUNDING",
    devices=("cpu",),
    control="the same function run eagerly",
    slow=True,
)
def inductor_lowp_compare(device: torch.device, control: bool) -> Observed:
    """(a + b) == a in bf16 with a = 1 and b = 2**-9 (below bf16's half step at 1): eager rounds
    the sum to 1 and the mask is all True."""

    def unchanged(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a + b) == a

    a = torch.ones(8, dtype=BF16, device=device)
    b = torch.full((8,), 2.0**-9, dtype=BF16, device=device)
    expected = unchanged(a, b)
    with _arm(unchanged, control) as (call, arm):
        got = call(a, b)
    flipped = int((got != expected).sum())
    return Observed(
        harm=flipped > 0,
        says=(
            f"bf16 (1 + 2**-9) == 1 under {arm}: {flipped} of {got.numel()} mask entries "
            f"differ from eager's (all True)"
        ),
        numbers={"flipped": float(flipped)},
    )


# --- AOTAutograd's cache key and the autocast dtype ----------------------------------------------


@reproduces(
    "KB-AOT-CACHE-AUTOCAST-DTYPE",
    devices=("cpu", "cuda"),
    control="the same compiles with torch._functorch.config.enable_autograd_cache=False",
    slow=True,
)
def aot_cache_autocast_dtype(device: torch.device, control: bool) -> Observed:
    """One Linear compiled by inductor and trained a step under bf16 autocast, twice (the second
    a cache hit: the cache is reached), then compiled afresh under fp16 autocast in the same
    process and cache: the dtype the fp16 compile's Linear ran in."""
    _autocast_available(device, F16)
    cache_off = torch_compile.NO_AUTOGRAD_CACHE
    setting = cache_off if control and cache_off.available() else None
    with torch_compile.fresh_cache_dir(), torch_compile.denormals_kept():
        compiles = torch_compile.linear_compiles(device, (BF16, BF16, F16), setting)
    if not control and not compiles[1].counts["hit"]:
        raise Unavailable(
            f"AOTAutograd's cache is off or refuses the graph in torch {torch.__version__} "
            f"(no hit on a repeated compile: {', '.join(map(str, compiles))}): the bug needs it"
        )
    served = compiles[2].dtype
    return Observed(
        harm=served != F16,
        says=(
            f"a Linear compiled under bf16 autocast twice, then afresh under fp16"
            f"{' without the AOTAutograd cache' if control else ''}: "
            f"{', '.join(map(str, compiles))}; the fp16 compile ran in {served}"
        ),
        numbers={"fp16_run_is_fp16": float(served == F16), "cache_hits": compiles[1].counts["hit"]},
    )


# --- inductor and a convolution of mixed dtypes --------------------------------------------------


@reproduces(
    "KB-INDUCTOR-MIXED-CONV-ACCEPTED",
    devices=("cpu",),
    control="the same call run eagerly",
    slow=True,
)
def inductor_mixed_conv(device: torch.device, control: bool) -> Observed:
    """A bf16 activation convolved with an fp32 weight and no bias (a cast forgotten at the edge
    of a mixed-precision region): eager refuses it; does the run go through, and in which dtype."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1, 2, 6, 6, generator=generator).to(device, BF16)
    weight = torch.randn(3, 2, 3, 3, generator=generator).to(device)
    return _mixed_dtypes(F.conv2d, "F.conv2d(bf16, fp32 weight, no bias)", x, weight, control)
