"""Compiled mixed precision as a user meets it: the harm, and the precision inductor changes.

Each test holds a compiled arm per backend (aot_eager: dynamo and AOTAutograd, then eager
kernels; inductor: its own code generation on top) against eager from the same inputs, and
measures the upstream setting that should restore eager's behaviour where the release has it:
- CMP-DISABLED-REGION, the harm: a float16 GradScaler loop of a model whose float32 head sits in
  an autocast(enabled=False) region. Compiled, the region's backward runs in float16
  (AOTAutograd's backward_pass_autocast="same_as_forward"), its gradient overflows, and the
  scaler skips steps and halves its scale while eager trains (harness.lab.autocast.scaled_loop).
- CMP-OVERFLOW-PARITY: a float16 product past float16's range, inf in eager; inductor keeps the
  fused product in float32, so its float32 value is finite where the stored float16 is inf.
- CMP-ROUNDING-PARITY: an explicit x.to(bfloat16).to(float32), and a float32 tensor added to a
  cast to bfloat16: inductor elides the rounding eager does.
- CMP-DTYPE-SWITCH, the AOTAutograd cache: a Linear compiled under bfloat16, compiled again
  (a hit: the cache is reached), then under float16: served bfloat16's graph where the key
  leaves the autocast dtype out, with the cache as the release has it and turned on.
A compile that raises is its own outcome ("cannot compile", harness.catalogue.verdicts), never
the claim's verdict. Every test compiles into a fresh inductor cache, so that nothing compiled by
another test or an earlier session is served to it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from harness.lab import releases
from harness.lab.autocast import torch_compile
from harness.lab.autocast.scaled_loop import INIT_SCALE, scaled_training

# torch.compile traces and compiles each arm: the slow tier (`amp-harness run --all`).
pytestmark = pytest.mark.slow

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
BACKENDS = torch_compile.BACKENDS
BACKWARD_OFF, EAGER_ROUNDING = torch_compile.BACKWARD_OUTSIDE_AUTOCAST, torch_compile.EAGER_ROUNDING
EMULATES_CASTS = "inductor-cpu-emulates-precision-casts"
CACHE_KEYS_DTYPE = "aot-cache-key-lacks-autocast-dtype"  # the key, the cache on or turned on


@pytest.fixture(autouse=True)
def _fresh_inductor_cache():
    """A cache of the test's own: its verdict depends on neither test order nor disk state."""
    with torch_compile.fresh_cache_dir():
        yield


def _arms(amp_device) -> tuple[list[str], str]:
    backends, left_out = torch_compile.backends_here(amp_device, BACKENDS)
    if not backends:
        pytest.skip(left_out.strip() or "no torch.compile backend to measure")
    return backends, left_out


def _attempt(measure: Callable[[], object]) -> tuple[object, str]:
    """What `measure` returns, or the line of what compiling or running it raised (the
    compiler's failure is what was measured: the arm's "cannot compile")."""
    with torch_compile.denormals_kept():
        try:
            return measure(), ""
        except Exception as exc:  # BackendCompilerFailed, InductorError, ...
            return None, torch_compile.error_line(exc)


def _remedy_predicted(amp_device) -> bool:
    """Whether emulate_precision_casts is predicted to restore eager's rounding here."""
    return releases.behaviour(EMULATES_CASTS, amp_device.type) == releases.CURRENT


# --- CMP-DISABLED-REGION: the harm under GradScaler ------------------------------------------

STEPS = 8  # enough for the compiled arm's scale to fall until its float16 gradient fits


def _described(history) -> str:
    return (
        f"{history.steps_skipped} of {STEPS} steps skipped, scale {INIT_SCALE:g} -> "
        f"{history.scales[-1]:g}, loss {history.losses[0]:.4g} -> {history.losses[-1]:.4g}, "
        f"non-finite head gradient on {sum(n > 0 for n in history.nonfinite)} steps"
    )


@pytest.mark.claim("CMP-DISABLED-REGION")
@pytest.mark.requires("fp16_autocast", "grad_scaler")
def test_disabled_region_harm_under_grad_scaler(record, amp_device):
    device = amp_device.torch_device
    backends, left_out = _arms(amp_device)
    eager = scaled_training(device, None, steps=STEPS)
    arms, errors = {}, {}
    for backend in backends:
        for setting in (None, BACKWARD_OFF):
            # The arm's name, a metric's name too: the setting's name and value, no "=".
            name = backend if setting is None else f"{backend} {setting.name} {setting.value}"
            if setting is not None and not setting.available():
                continue
            found, error = _attempt(lambda b=backend, s=setting: scaled_training(
                device, b, s, steps=STEPS))  # fmt: skip
            arms[name], errors[name] = found, error
    # Negative control: eager at a scale whose float32 gradient overflows skips: the reading
    # tells a skipped step from a taken one.
    control = scaled_training(device, None, steps=1, init_scale=2.0**126)

    harmed = {n: None if errors[n] else h.steps_skipped > eager.steps_skipped
              for n, h in arms.items()}  # fmt: skip
    for name, history in {"eager": eager, **arms}.items():
        if history is not None:
            record.history(prefix=f"{name}/", loss=history.losses, scale=history.scales)
            record.key_metric(**{f"steps_skipped/{name}": history.steps_skipped})
    record.key_metric(**{f"cannot_compile/{n}": int(bool(e)) for n, e in errors.items()})
    absent = "" if BACKWARD_OFF.available() else f"; {BACKWARD_OFF.label}: not in torch "
    suffix = f" {BACKWARD_OFF.name} {BACKWARD_OFF.value}"
    named = {n: n.replace(suffix, f" with {BACKWARD_OFF.label}") for n in arms}
    record.verdict(
        "CMP-DISABLED-REGION",
        record.over_arms({b: harmed[b] for b in backends}),
        f"float16 autocast on {amp_device.type}, a float32 head in an autocast(enabled=False) "
        f"region trained {STEPS} SGD steps with torch.amp.GradScaler from {INIT_SCALE:g}: "
        f"eager: {_described(eager)}; "
        + "; ".join(
            f"{named[n]}: cannot compile ({errors[n]})"
            if errors[n]
            else f"{named[n]}: {_described(h)}"
            for n, h in arms.items()
        )  # fmt: skip
        + (absent + torch.__version__ if absent else "")
        + f"; control, eager from {2.0**126:g}: {control.steps_skipped} of 1 skipped."
        + left_out,
    )
    wrong = [f"{n}: cannot compile ({e})" for n, e in errors.items() if e]
    for name, history in arms.items():
        restored = name not in backends  # the workaround's arm: predicted as eager
        if history is not None and harmed[name] == restored:
            want = "eager's steps" if restored else "steps skipped where eager's are not"
            wrong.append(f"{name}: predicted {want}, got {_described(history)}")
    assert not wrong, "CMP-DISABLED-REGION: " + "; ".join(wrong)
    assert eager.steps_skipped == 0 and control.steps_skipped == 1, (
        f"CMP-DISABLED-REGION: control: predicted eager to take every step and to skip from "
        f"{2.0**126:g}, got {_described(eager)} and {control.steps_skipped} of 1 skipped"
    )


# --- CMP-OVERFLOW-PARITY and CMP-ROUNDING-PARITY ---------------------------------------------


def _overflow(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A float16 product, stored, cast up to float32, and tested for inf in the same graph."""
    product = x * x
    return product, product.float(), torch.isinf(product)


def _overflow_seen(outputs, inputs) -> tuple[bool, float, bool]:
    """(the stored float16 product is inf, its float32 value, the in-graph isinf)."""
    stored, value, isinf = outputs
    return bool(torch.isinf(stored).all()), float(value.max()), bool(isinf.all())


def _roundings(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An explicit rounding to bfloat16 and back, and a float32 tensor added to a cast."""
    return x.to(BF16).to(F32), x.to(BF16) + y


def _rounding_seen(outputs, inputs) -> tuple[float, float]:
    """How far each output is from the same arithmetic without the rounding: the rounding
    done, in float64."""
    x, y = (t.double() for t in inputs)
    unrounded = (x, x + y)
    return tuple(float((o.double() - u).abs().max()) for o, u in zip(outputs, unrounded,
                                                                    strict=True))  # fmt: skip


@dataclass(frozen=True)
class Case:
    fn: Callable
    inputs: tuple[torch.Tensor, ...]
    harmless: tuple[torch.Tensor, ...]  # inputs with no overflow, no rounding to lose
    seen: Callable  # (outputs, inputs) -> what is compared with eager's
    what: str


def _case(name: str, amp_device) -> Case:
    device = amp_device.torch_device
    if name == "overflow":
        big, small = (torch.full((4,), v, dtype=F16, device=device) for v in (6000.0, 100.0))
        what = "stored product inf, its float32 value, in-graph isinf"
        return Case(_overflow, (big,), (small,), _overflow_seen, what)
    x = (torch.arange(16, dtype=F32, device=device) / 7 + 1).reshape(4, 4)
    exact = torch.full((4, 4), 1.5, device=device)  # bfloat16 holds it
    what = "rounding done by the round trip, by the mixed add"
    return Case(_roundings, (x, x), (exact, exact), _rounding_seen, what)


def _parity(amp_device, name: str, backend: str | None, setting=None, harmless=False):
    case = _case(name, amp_device)
    inputs = case.harmless if harmless else case.inputs
    call = case.fn if backend is None else torch_compile.fresh(case.fn, backend)
    with setting.applied() if setting else contextlib.nullcontext():
        return case.seen(call(*inputs), inputs)


def _shown(seen) -> str:
    return "(" + ", ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in seen) + ")"


@pytest.mark.parametrize(
    ("name", "claim"),
    [
        pytest.param("overflow", "CMP-OVERFLOW-PARITY", marks=(
            pytest.mark.claim("CMP-OVERFLOW-PARITY"), pytest.mark.requires("fp16_autocast"))),
        pytest.param("rounding", "CMP-ROUNDING-PARITY", marks=(
            pytest.mark.claim("CMP-ROUNDING-PARITY"), pytest.mark.requires("bf16_autocast"))),
    ],
)  # fmt: skip
def test_compiled_precision_matches_eager(record, amp_device, name, claim):
    backends, left_out = _arms(amp_device)
    eager = _parity(amp_device, name, None)
    found, errors, remedies = {}, {}, {}
    for backend in backends:
        found[backend], errors[backend] = _attempt(lambda b=backend: _parity(amp_device, name, b))
        if errors[backend] or found[backend] == eager:
            continue
        if not EAGER_ROUNDING.available():
            remedies[backend] = f"not in torch {torch.__version__}"
            continue
        fixed, error = _attempt(lambda b=backend: _parity(amp_device, name, b, EAGER_ROUNDING))
        remedies[backend] = (
            f"raised {error}"
            if error
            else "as eager"
            if fixed == eager
            else f"still {_shown(fixed)}"
        )
    # Negative control: eager on harmless inputs reads otherwise than on the case's: the
    # reading sees the overflow, the rounding, where they happen.
    control = _parity(amp_device, name, None, harmless=True)

    differs = {b: None if errors[b] else found[b] != eager for b in backends}
    record.key_metric(**{f"differs/{b}": int(bool(d)) for b, d in differs.items()})
    record.key_metric(**{f"cannot_compile/{b}": int(bool(e)) for b, e in errors.items()})
    record.verdict(
        claim,
        record.over_arms(differs),
        f"{name} on {amp_device.type} ({_case(name, amp_device).what}): eager {_shown(eager)}; "
        + "; ".join(
            f"{b}: cannot compile ({errors[b]})" if errors[b] else f"{b}: {_shown(found[b])}"
            for b in backends
        )
        + "".join(f"; with {EAGER_ROUNDING.label} ({b}): {r}" for b, r in remedies.items())
        + f"; control, harmless inputs in eager: {_shown(control)}."
        + left_out,
    )
    wrong = [f"{b}: cannot compile ({e})" for b, e in errors.items() if e]
    for backend, differ in differs.items():
        predicted = backend == "inductor"  # inductor keeps fused intermediates in float32
        if differ is not None and differ != predicted:
            want = "a difference from eager" if predicted else "eager's"
            wrong.append(f"{backend}: predicted {want}, got {_shown(found[backend])}")
    predicted_remedy = releases.describe(EMULATES_CASTS, amp_device.type)
    for backend, remedy in remedies.items():
        if EAGER_ROUNDING.available() and (remedy == "as eager") != _remedy_predicted(amp_device):
            wrong.append(
                f"with {EAGER_ROUNDING.label} ({backend}): {predicted_remedy}; got {remedy}"
            )
    assert not wrong, f"{claim}: " + "; ".join(wrong)
    assert control != eager, f"{claim}: control: predicted harmless inputs to read otherwise"


# --- CMP-DTYPE-SWITCH: AOTAutograd's cache key ------------------------------------------------

# A Linear compiled afresh (dynamo reset) for each dtype in turn, into one cache: the second
# bfloat16 compile shows the cache reached (a hit), the float16 one whether its key holds the
# autocast dtype. A plain Linear under the ambient autocast: a graph holding an autocast region
# of its own bypasses the cache from 2.12 on (its in-graph autocast call is not cacheable).
CACHE_ORDER = (BF16, BF16, F16)
CACHE_ON = torch_compile.CACHE_ON


def _compiles(amp_device, setting=None) -> list[torch_compile.Compiled]:
    return torch_compile.linear_compiles(amp_device.torch_device, CACHE_ORDER, setting)


def _cache_unpredicted(compiles: list[torch_compile.Compiled], cache_on: bool) -> str | None:
    """With the cache on: the repeated bfloat16 compile a hit, and the float16 one served
    bfloat16's graph exactly where the key leaves the dtype out (CACHE_KEYS_DTYPE); off: no
    hit, each compile its own dtype."""
    reached, served = compiles[1].counts["hit"] > 0, compiles[2].dtype == BF16
    keyless = (
        cache_on and releases.behaviour(CACHE_KEYS_DTYPE, releases.ANY_DEVICE) == releases.BEFORE
    )
    if reached != cache_on or served != keyless:
        return (
            f"predicted {'a hit' if cache_on else 'no hit'} on the repeated bfloat16 compile and "
            f"the float16 compile {'served bfloat16' if keyless else 'in float16'} "
            f"({releases.describe(CACHE_KEYS_DTYPE, releases.ANY_DEVICE)}), got "
            + ", ".join(map(str, compiles))
        )
    return None


@pytest.mark.claim("CMP-DTYPE-SWITCH")
@pytest.mark.requires("bf16_autocast", "fp16_autocast")
def test_cache_key_holds_the_autocast_dtype(record, amp_device):
    backends, left_out = _arms(amp_device)
    if "inductor" not in backends:
        pytest.skip(f"AOTAutograd's cache is inductor's:{left_out}")
    cache_on = torch_compile.autograd_cache_on()
    arms = {"as released": (_attempt(lambda: _compiles(amp_device)), cache_on)}
    if not cache_on and CACHE_ON.available():  # the key itself, measured with the cache on
        arms["cache on"] = (_attempt(lambda: _compiles(amp_device, CACHE_ON)), True)
    errors = {arm: error for arm, ((_, error), _) in arms.items() if error}
    served = {arm: None if error else found[2].dtype == BF16
              for arm, ((found, error), _) in arms.items()}  # fmt: skip

    state = "on" if cache_on else "off" if CACHE_ON.available() else "absent"
    record.param(aot_autograd_cache=state)
    record.key_metric(**{f"served_other_dtype/{a}": int(bool(s)) for a, s in served.items()})
    record.verdict(
        "CMP-DTYPE-SWITCH",
        record.over_arms({"inductor": served["as released"]}),
        f"a Linear compiled by inductor afresh under "
        f"{', '.join(str(d).removeprefix('torch.') for d in CACHE_ORDER)} autocast on "
        f"{amp_device.type}, one fresh cache (AOTAutograd's cache {state} as released in torch "
        f"{torch.__version__}): "
        + "; ".join(
            f"{arm}: cannot compile ({error})" if error else f"{arm}: {', '.join(map(str, found))}"
            for arm, ((found, error), _) in arms.items()
        )
        + "."
        + left_out,
    )
    wrong = [f"{arm}: cannot compile ({error})" for arm, error in errors.items()]
    wrong += [
        f"{arm}: {problem}"
        for arm, ((found, error), on) in arms.items()
        if not error and (problem := _cache_unpredicted(found, on))
    ]
    assert not wrong, "CMP-DTYPE-SWITCH: " + "; ".join(wrong)
    # Negative control: the first compile of the fresh cache is a miss where the cache is on
    # (nothing served from before), and each arm's first compile ran in bfloat16.
    firsts = [found[0] for ((found, error), _on) in arms.values() if not error]
    assert all(f.dtype == BF16 and f.counts["hit"] == 0 for f in firsts), (
        "CMP-DTYPE-SWITCH: control: predicted a first compile in bfloat16 with no hit, got "
        + ", ".join(map(str, firsts))
    )
