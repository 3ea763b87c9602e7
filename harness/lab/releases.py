"""Behaviours that changed between torch releases, each with the releases it was measured on.

A scenario's prediction is today's behaviour. Where a release is known to behave otherwise, the
scenario asks `behaviour(change_name, device)` which side of the change the running torch is on
and predicts accordingly, and the evidence says so. What makes an entry here: the change was
measured, not read about. `since` is the first release with today's behaviour, found by
installing releases and running the scenario (a bisection over the releases PyPI has);
`before_seen` lists the releases measured with the old one. A release older than every one
measured is outside the known range: it keeps today's prediction, so that an unexpected result
there still fails instead of being explained away.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.common.versions import release_of

CURRENT, BEFORE = "current", "before"
ANY_DEVICE = "any"  # a change of code every device runs (Dynamo, AOTAutograd, a meta function)


@dataclass(frozen=True)
class Change:
    claims: tuple[str, ...]  # the claims whose prediction follows it, the first the one it names
    device: str  # the device type it applies to ("cpu", "cuda") or ANY_DEVICE
    since: tuple[int, int]  # the first release (major, minor) with today's behaviour
    before_seen: tuple[str, ...]  # releases measured with the old behaviour, oldest first
    before: str  # what releases before `since` do
    current: str  # what `since` and later do
    how: str  # how the change was found: the bisection and its measurements

    @property
    def first(self) -> str:
        """The first release with today's behaviour, as written: "2.6"."""
        return ".".join(map(str, self.since))

    def applies_to(self, device: str) -> bool:
        return self.device in (ANY_DEVICE, device)

    @property
    def where(self) -> str:
        return "every device" if self.device == ANY_DEVICE else self.device


CHANGES: dict[str, Change] = {
    "half-batchnorm-cpu-variance": Change(
        claims=("PIT2-NORM-HALF",),
        device="cpu",
        since=(2, 6),
        before_seen=("2.4.1", "2.5.1"),
        before=(
            "a .half() BatchNorm's batch variance is accumulated in fp16 on the CPU: the sum of "
            "squared deviations overflows once (n-1) std^2 > 65504, i.e. std > 46.0 for a batch "
            "of 32, and running_var is inf after the first step"
        ),
        current=(
            "the batch variance is accumulated in fp32 and stored in fp16: running_var "
            "overflows only once std^2 itself exceeds 65504, i.e. std > 255.9, after the number "
            "of steps the momentum recursion predicts (46 at std 257)"
        ),
        how=(
            "bisected over PyPI's releases with PIT2-NORM-HALF's BatchNorm sweep (batch 32x4, "
            "100 steps): 2.4.1 and 2.5.1 overflow at step 1 from std 46 on and stay finite at std "
            "45; 2.6.0, 2.7.1, 2.8.0, 2.9.1, 2.13.0 and 2.14.1 stay finite up to std 256 and "
            "overflow from std 257 at step 46. The change is pytorch/pytorch#126525 ('Use float "
            "data type for Half var_sum in batchnorm stats updating on CPU', merged 2024-09-09, "
            "first in 2.6)"
        ),
    ),
    "rms-norm-mixed-dtype-output": Change(
        claims=("AMP-NORM-FP32",),
        device="cpu",
        since=(2, 7),
        before_seen=("2.4.1", "2.5.1", "2.6.0"),
        before=(
            "an nn.RMSNorm whose weight is fp32, fed fp16 activations under CPU fp16 autocast "
            "(rms_norm is on no CPU autocast list), normalises in fp16 and multiplies by the "
            "fp32 weight last: type promotion makes its output float32"
        ),
        current=(
            "the same nn.RMSNorm returns its input's dtype, float16 (from 2.9 with a UserWarning "
            "that the mixed dtypes miss the fused kernel)"
        ),
        how=(
            "measured with AMP-NORM-FP32's probe (nn.Linear(8, 16) then nn.RMSNorm(16), CPU "
            "fp16 autocast) on PyPI's releases: float32 output on 2.4.1, 2.5.1 and 2.6.0; "
            "float16 on 2.7.1, 2.8.0, 2.9.1, 2.13.0 and 2.14.1. Without a weight, F.rms_norm "
            "returns float16 on all of them: the float32 came from the product with the weight"
        ),
    ),
    "e4m3-cpu-cast-saturates": Change(
        claims=(
            "FP8-E4M3-OVERFLOW-SATURATES",
            "FP8-E4M3-INF-IS-NAN",
            "FP8-DELAYED-SCALING-SPIKE",
        ),  # fmt: skip
        device="cpu",
        since=(2, 13),
        before_seen=("2.4.1", "2.5.1", "2.6.0", "2.9.1", "2.11.0", "2.12.1"),
        before=(
            "a CPU cast to float8_e4m3fn gives NaN for a finite value that rounds beyond 448 "
            "and for +-inf"
        ),
        current="the CPU cast saturates both a finite overflow and +-inf to +-448",
        how=(
            "measured with FP8-E4M3-OVERFLOW-SATURATES's casts (465, 500, 1e4, 1e30, float32's "
            "max, their negatives, +-inf) on PyPI's releases: NaN on 2.4.1, 2.5.1, 2.6.0, 2.9.1, "
            "2.11.0 and 2.12.1; +-448 on 2.13.0 and 2.14.1 (464, the tie below the NaN slot, "
            "gives 448 on all). The change is pytorch/pytorch#178817 ('Properly saturate E4M3 "
            "on finite-overflow on CPU/C++ conversion code', merged 2026-04-17, first in 2.13)"
        ),
    ),
    # Compiled AMP (scenarios/test_compiled_amp.py), each measured on the CPU with the claim's
    # scenario on PyPI's releases 2.4.1, 2.5.1, 2.6.0, 2.9.1, 2.11.0, 2.12.1, 2.13.0 and 2.14.1.
    "inductor-compiles-sdpa-backward": Change(
        claims=(
            "CMP-BLOCK-DTYPES",
            "CMP-DISABLED-REGION",
            "CMP-DTYPE-SWITCH",
            "CMP-WEIGHT-CACHE",
            "CMP-SCALER-SKIP",
            "CMP-LOSS-CURVE",
        ),  # fmt: skip
        device="cpu",
        since=(2, 6),
        before_seen=("2.5.1",),
        before=(
            "inductor raises compiling the backward of scaled_dot_product_attention in bfloat16 "
            "or float16 at static shapes (an AssertionError fusing two C++ loops)"
        ),
        current="inductor compiles it, at static and dynamic shapes",
        how=(
            "2.5.1 raises `assert vars1 == vars2` (the failure of pytorch/pytorch#138550, fixed "
            "by #138568 for 2.6); with dynamic=True, and on 2.4.1, 2.6.0 and later, it compiles"
        ),
    ),
    "inductor-keeps-denormals": Change(
        claims=("CMP-BLOCK-DTYPES",),
        device="cpu",
        since=(2, 6),
        before_seen=("2.4.1", "2.5.1"),
        before=(
            "loading an inductor CPU kernel turns flush-to-zero on for the whole process "
            "(-ffast-math's start-up code), so float32 subnormals become 0 from then on"
        ),
        current="loading an inductor CPU kernel leaves the process's flush-to-zero mode as it was",
        how=(
            "2.4.1 and 2.5.1 flush after the first compiled call, 2.6.0 and later do not "
            "(pytorch/pytorch#126848, fixed by #133842 for 2.6)"
        ),
    ),
    "dynamo-guards-autocast-dtype": Change(
        claims=("CMP-DTYPE-SWITCH",),
        device=ANY_DEVICE,
        since=(2, 7),
        before_seen=("2.4.1", "2.5.1", "2.6.0"),
        before=(
            "Dynamo guards no ambient autocast state: a function compiled under bfloat16 "
            "autocast and called under float16 runs its bfloat16 graph, on every backend"
        ),
        current="the call under another autocast dtype recompiles and computes in that dtype",
        how=(
            "2.4.1, 2.5.1 and 2.6.0 reuse the graph (pytorch/pytorch#112260); 2.9.1 and later "
            "recompile. The guard is #143592, merged 2024-12-19 and not in 2.6.0: 2.7 is taken "
            "as the first release with it, 2.7 and 2.8 not measured"
        ),
    ),
    "aot-cache-keys-autocast-dtype": Change(
        claims=(
            "CMP-BLOCK-DTYPES",
            "CMP-DISABLED-REGION",
            "CMP-DTYPE-SWITCH",
            "CMP-SCALER-SKIP",
            "CMP-DYNAMIC-SHAPES",
        ),  # fmt: skip
        device=ANY_DEVICE,
        since=(2, 13),
        before_seen=("2.9.1", "2.10.0", "2.11.0", "2.12.1"),
        before=(
            "inductor's AOTAutograd cache, on by default, keys a graph by whether autocast is "
            "on, not by its dtype: the graph compiled first under bfloat16 is served to a later "
            "compile under float16, or the other way round"
        ),
        current="the cache keys the autocast dtype: each dtype gets its own graph",
        how=(
            "scenarios/test_compiled_parity.py's Linear, compiled by inductor into one fresh "
            "cache under bfloat16, bfloat16, float16 (the second compile a cache hit): 2.9.1 "
            "serves the float16 compile bfloat16's graph as released; so do 2.10.0, 2.11.0 and "
            "2.12.1 (the known-bug ledger's reproduction, the same Linear); 2.13.0 and 2.14.1 "
            "miss and compile float16 (pytorch/pytorch#181564). Before 2.7 the cache is off as "
            "released ('aot-autograd-cache-on-by-default'): outside this change's range, and "
            "'aot-cache-key-lacks-autocast-dtype' is the key itself, the cache turned on"
        ),
    ),
    # The key itself, wherever the cache is turned on: what the cache-key test measures in its
    # arm with the cache on (2.5.1, 2.6.0, where it is off as released).
    "aot-cache-key-lacks-autocast-dtype": Change(
        claims=("CMP-DTYPE-SWITCH",),
        device=ANY_DEVICE,
        since=(2, 13),
        before_seen=("2.5.1", "2.6.0", "2.9.1", "2.10.0", "2.11.0", "2.12.1"),
        before=(
            "AOTAutograd's cache, where it is on (by default from 2.7, turned on before), keys a "
            "graph by whether autocast is on, not by its dtype"
        ),
        current="the cache keys the autocast dtype: each dtype gets its own graph",
        how=(
            "the cache-key test's Linear with torch._functorch.config.enable_autograd_cache "
            "turned on: 2.5.1 and 2.6.0 serve the float16 compile bfloat16's graph, as 2.9.1 to "
            "2.12.1 do as released; 2.13.0 and 2.14.1 do not (pytorch/pytorch#181564); 2.4.1 "
            "has no such cache"
        ),
    ),
    # What a compile as released meets: the key above matters only where the cache is on.
    "aot-autograd-cache-on-by-default": Change(
        claims=("CMP-DTYPE-SWITCH",),
        device=ANY_DEVICE,
        since=(2, 7),
        before_seen=("2.4.1", "2.5.1", "2.6.0"),
        before=(
            "AOTAutograd's cache of compiled graphs is off by default (2.4.1 has none): a "
            "compile as released never meets the cache or its key"
        ),
        current="the cache is on by default: a compile as released is served from it",
        how=(
            "torch._functorch.config.enable_autograd_cache read on each release installed: "
            "absent on 2.4.1, False on 2.5.1 and 2.6.0, True on 2.9.1, 2.10.0 and later "
            "(pytorch/pytorch#141981 turned it on after 2.6's branch cut: 2.7 is taken as the "
            "first release with it, 2.7 and 2.8 not measured)"
        ),
    ),
    "inductor-cpu-emulates-precision-casts": Change(
        claims=("CMP-ROUNDING-PARITY", "CMP-OVERFLOW-PARITY"),
        device="cpu",
        since=(2, 13),
        before_seen=("2.5.1", "2.6.0", "2.9.1"),
        before=(
            "torch._inductor.config.emulate_precision_casts does not restore eager's rounding "
            "in inductor's CPU code: no effect on 2.5.1 and 2.6.0; on 2.9.1 none on a round "
            "trip through bfloat16, and an InductorError (CppVecOverrides.to_dtype() got an "
            "unexpected keyword argument 'use_compute_types') compiling a float16 product's cast"
        ),
        current=(
            "emulate_precision_casts restores eager's rounding of each cast to a low dtype, "
            "and with it a float16 overflow's inf"
        ),
        how=(
            "scenarios/test_compiled_parity.py's cases (x.to(bfloat16).to(float32), a float32 "
            "tensor added to a cast to bfloat16, a float16 product past 65504 cast up) under "
            "inductor with the mode on: unchanged on 2.5.1 and 2.6.0, unchanged (bfloat16) or "
            "raising (float16) on 2.9.1, as eager on 2.13.0 and 2.14.1 (the mode: "
            "pytorch/pytorch#131595; absent on 2.4.1). 2.10 to 2.12 not measured: 2.13 is the "
            "first release taken as fixed"
        ),
    ),
    "inductor-checks-mixed-bmm": Change(
        claims=("CMP-DISABLED-REGION",),
        device=ANY_DEVICE,
        since=(2, 12),
        before_seen=("2.4.1", "2.5.1", "2.6.0", "2.9.1", "2.11.0"),
        before=(
            "a batched matmul of a bfloat16 tensor and a float32 one, which eager and aot_eager "
            "refuse, computes in float32 under inductor"
        ),
        current="inductor refuses it at compile time, as eager does",
        how=(
            "inductor computes float32 on 2.4.1, 2.5.1, 2.6.0, 2.9.1 and 2.11.0 and raises on "
            "2.12.1, 2.13.0 and 2.14.1: bmm's meta function checks the dtypes "
            "(pytorch/pytorch#171190, fixed by #173459); meta functions are alike on every device"
        ),
    ),
    "multilabel-margin-decomposition": Change(
        claims=("CMP-ATLAS",),
        device=ANY_DEVICE,
        since=(2, 14),
        before_seen=("2.4.1", "2.5.1", "2.6.0", "2.9.1", "2.11.0", "2.12.1", "2.13.0"),
        before=(
            "compiled multilabel_margin_loss counts the target slots after a row's first -1 "
            "as class 0 (the Python decomposition AOTAutograd uses), so its loss and gradient "
            "differ from eager's, with autocast or without"
        ),
        current="compiled multilabel_margin_loss stops at a row's first -1, as eager does",
        how=(
            "F.multilabel_margin_loss on targets [[0, 2, -1, 0], [1, -1, 0, 0]], eager against "
            "aot_eager: 1.0875 against 3.2875 on 2.4.1, 2.5.1, 2.6.0, 2.9.1, 2.11.0, 2.12.1 and "
            "2.13.0, 1.0875 on both on 2.14.1 (pytorch/pytorch#141017, #185464; fixed by "
            "#189552). Found by CMP-ATLAS"
        ),
    ),
}


def release(version: str | None = None) -> tuple[int, int]:
    """(major, minor) of a torch version string ("2.5.1+cu124" -> (2, 5)); the running torch's
    by default."""
    return release_of(version or _running())


def _running() -> str:
    import torch  # here: the report and `compare` read releases without importing torch

    return torch.__version__


def oldest_seen(change: Change) -> tuple[int, int]:
    return min(release(v) for v in change.before_seen)


def behaviour(name: str, device: str, version: str | None = None) -> str:
    """BEFORE where the running torch (or `version`) is known to behave as before the change
    `name` on `device`; CURRENT otherwise: at or after `since`, on another device, or older than
    every release measured (outside the known range, today's prediction holds)."""
    change = CHANGES[name]
    seen = release(version)
    if not change.applies_to(device) or seen >= change.since or seen < oldest_seen(change):
        return CURRENT
    return BEFORE


def between(claim: str, environments: list[tuple[str, str]]) -> list[tuple[str, Change]]:
    """The known changes of `claim` that `environments` ((device, torch version) each) fall on
    both sides of: what predicts a difference of the claim between them."""
    found = []
    for name, change in CHANGES.items():
        if claim not in change.claims:
            continue
        sides = {
            behaviour(name, device, v) for device, v in environments if change.applies_to(device)
        }
        if len(sides) > 1:
            found.append((name, change))
    return found


def in_words(name: str) -> str:
    """A known change, in one sentence: when, where, what before and since."""
    change = CHANGES[name]
    return (
        f"Known change in torch {change.first} on {change.where} (harness.lab.releases "
        f"{name!r}): before, {change.before}; since, {change.current}."
    )


def describe(name: str, device: str, version: str | None = None) -> str:
    """One sentence for the evidence: which side of the change this run predicts, and why."""
    change = CHANGES[name]
    since = change.first
    version = version or _running()
    side = behaviour(name, device, version)
    if side == BEFORE:
        return f"predicted for torch {version} (before {since}, measured on " + (
            f"{', '.join(change.before_seen)}): {change.before}"
        )
    if not change.applies_to(device):
        return f"predicted: {change.current}"
    if release(version) < oldest_seen(change):
        return (
            f"torch {version} is older than every release measured for this change "
            f"({', '.join(change.before_seen)}): today's prediction holds: {change.current}"
        )
    return f"predicted for torch {version} (since {since}): {change.current}"
