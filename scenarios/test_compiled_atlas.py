"""The autocast atlas compiled (CMP-ATLAS): every op of scenarios/test_autocast_atlas.py, called
from the same inputs under torch.compile and autocast, held against its eager call: the dtype
it computed in, its gradients' dtypes, and its values within the autocast dtype's rounding
(harness.lab.autocast.compiled_atlas says how, and how the ops share graphs).

backend="aot_eager" (dynamo and AOTAutograd, then eager's kernels) runs everywhere: a mismatch
there is tracing's. backend="inductor" (its code generation and fusion on top) compiles about
190 ops in 3 dtypes of input, minutes on a CPU, so it runs where asked for: AMP_ATLAS_INDUCTOR=1.

Each op's compiled behaviour is kept as a metric (`op/<name>`, as the eager atlas's), which the
report's atlas table shows beside eager's columns; `holds/<op>` (1 where it matched eager in
every way) is the key metric `compare` and `baseline changes` hold across releases.

Measured on the CPU (float16 and bfloat16, aot_eager) on torch 2.4.1 to 2.14.1 (docs/autocast-
atlas.md, "Compiled autocast"): every op keeps eager's autocast but two. `torch.lstm`, which CPU
autocast runs as oneDNN's mkldnn_rnn_layer in the low dtype, computes in float32 compiled (its
cells traced apart, so no autocast rule for the LSTM applies); and multilabel_margin_loss, whose
compiled loss and gradient are wrong before 2.14, autocast or not (a decomposition that counts
the targets after a -1: harness.lab.releases 'multilabel-margin-decomposition'). A few ops break
the graph (ctc_loss and linalg_lstsq: output shapes that depend on the data) and are named.
The test asserts the fixed bug stays fixed and is still there where predicted; other mismatches
are the claim's verdict, not a failure, as in the eager atlas.

Negative control: the same comparison with a backend that casts `mm`'s output to float32 before
handing the graph to aot_eager names `mm`, and only it, among the ops that share its graph.
"""

from __future__ import annotations

import os

import pytest
import torch

from harness.lab import releases
from harness.lab.autocast import atlas as autocast_atlas
from harness.lab.autocast import compiled_atlas, torch_compile
from harness.lab.autocast import docs as autocast_docs
from harness.lab.autocast import ops as autocast_ops

# About 200 ops traced and compiled per dtype: about a minute on a 2-core CPU, so
# `amp-harness run` leaves this module out unless --all (the plugin's `slow` marker).
pytestmark = pytest.mark.slow

INDUCTOR_OPT_IN = "AMP_ATLAS_INDUCTOR"
CONTROL_OP = "mm"  # on every device's lower list, and compiled by every release
# Ops whose compiled mismatch is a known upstream bug with a release that fixed it: predicted to
# differ from eager before it, and to match from it on (a return of the bug is a regression).
FIXED_IN_A_RELEASE = {
    "multilabel_margin_loss": "multilabel-margin-decomposition",
    "multilabel_margin_loss_forward": "multilabel-margin-decomposition",
}


@pytest.fixture(autouse=True)
def _fresh_inductor_cache():
    """A cache of the test's own: no graph another test or session compiled under another
    autocast dtype is served to it (AOTAutograd's cache keyed no autocast dtype before 2.13),
    so that no verdict depends on test order or on the disk."""
    with torch_compile.fresh_cache_dir():
        yield


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _inductor_asked() -> bool:
    return os.environ.get(INDUCTOR_OPT_IN) == "1"


def _behaviour(found: compiled_atlas.OpCompiled, low: torch.dtype) -> str:
    """The eager atlas's words for what the compiled op did (harness.lab.autocast.atlas)."""
    if found.error:
        return compiled_atlas.NOT_COMPILED
    if found.computed.get("float32") == low:
        return "lower"
    if found.computed.get(_short(low)) == torch.float32:
        return "float32"
    if found.computed.get("mixed") == torch.float32:
        return "promote"
    return "input"


def _promote_ops(device_type: str) -> frozenset[str]:
    doc = autocast_docs.documented(device_type, torch.__version__)
    return frozenset(
        op for op in autocast_ops.CALLS if autocast_docs.listed(op, doc, device_type) == "promote"
    )


def _known(op: str, device_type: str) -> str:
    change = FIXED_IN_A_RELEASE.get(op)
    return f" (a known bug: {releases.describe(change, device_type)})" if change else ""


def _unpredicted(found: dict[str, compiled_atlas.OpCompiled], device_type: str) -> list[str]:
    """The ops of FIXED_IN_A_RELEASE not on the side of their fix this release predicts."""
    wrong = []
    for op, change in FIXED_IN_A_RELEASE.items():
        if op not in found or found[op].error:
            continue
        before = releases.behaviour(change, device_type) == releases.BEFORE
        if before != bool(found[op].mismatches):
            wrong.append(
                f"{op}: predicted {'a mismatch' if before else 'as eager'} "
                f"({releases.describe(change, device_type)}), got "
                + ("; ".join(found[op].mismatches) or "as eager")
            )
    return wrong


@pytest.mark.claim("CMP-ATLAS")
@pytest.mark.parametrize(
    "backend",
    [
        "aot_eager",
        pytest.param(
            "inductor",
            marks=[
                pytest.mark.requires("inductor_compile"),
                pytest.mark.skipif(
                    not _inductor_asked(),
                    reason=f"inductor's atlas compiles about 190 ops three times over (minutes "
                    f"on a CPU): set {INDUCTOR_OPT_IN}=1 to measure it",
                ),
            ],
        ),
    ],
)
@pytest.mark.parametrize(
    "low",
    [
        pytest.param(torch.float16, marks=pytest.mark.requires("fp16_autocast"), id="float16"),
        pytest.param(torch.bfloat16, marks=pytest.mark.requires("bf16_autocast"), id="bfloat16"),
    ],
)
def test_compiled_ops_keep_eager_autocast(record, amp_device, low, backend):
    device = amp_device.torch_device
    # An op whose kernel in `low` this hardware lacks raises eagerly and is left out here: its
    # compiled comparison follows the hardware, as the eager atlas's verdicts do.
    needs = autocast_atlas.HARDWARE_KERNELS.get((amp_device.type, low), {})
    record.depends_on_hardware(*needs.values())
    found = compiled_atlas.measure(device, low, backend, _promote_ops(amp_device.type))
    broken = {op: f for op, f in found.items() if f.mismatches}
    not_compiled = {op: f.error for op, f in found.items() if f.error}
    held = [op for op, f in found.items() if not f.error and not f.mismatches]

    # Negative control: mm's output cast to float32 inside the graph, its chunk's ops compiled
    # with it: the comparison names mm, and no neighbour of it in the graph.
    names = list(autocast_ops.CALLS)
    at = names.index(CONTROL_OP)
    chunk = names[at - at % compiled_atlas.CHUNK :][: compiled_atlas.CHUNK]
    control = compiled_atlas.measure(
        device, low, torch_compile.casting_backend(torch.mm, torch.float32), ops=chunk
    )
    named = sorted(op for op, f in control.items() if f.mismatches)

    record.param(
        autocast_dtype=_short(low),
        compiled_backend=backend,
        chunk=compiled_atlas.CHUNK,
        not_compiled=", ".join(not_compiled) or "none",
        # the report's atlas table marks these cells
        mismatched_ops=",".join(broken),
    )
    record.metric(
        **{f"op/{op}": autocast_docs.CODES[_behaviour(f, low)] for op, f in found.items()},
        ops_not_compiled=len(not_compiled),
        ops_mismatched=len(broken),
    )
    record.key_metric(
        **{f"holds/{op}": float(op not in broken) for op in found if op not in not_compiled}
    )
    verdict = "confirmed" if not broken else "refuted" if not held else "partly"
    record.verdict(
        "CMP-ATLAS",
        verdict if held or broken else "inconclusive",
        f"{_short(low)} autocast on {amp_device.type}, {backend}: {len(found)} ops, "
        f"{compiled_atlas.CHUNK} to a graph; {len(held)} kept eager's dtypes, gradients and "
        f"values (within {compiled_atlas.tolerance(low):.3g} of the largest entry)"
        + "".join(
            f"; {op}: {'; '.join(f.mismatches)}{_known(op, amp_device.type)}"
            for op, f in broken.items()
        )
        + (
            "; not compiled whole (fullgraph, so a graph break is named, not run eagerly): "
            + "; ".join(f"{op} ({error})" for op, error in not_compiled.items())
            if not_compiled
            else ""
        )
        + f"; control, {CONTROL_OP}'s output cast to float32 in the graph: named "
        + (", ".join(named) or "nothing")
        + ".",
    )
    unpredicted = _unpredicted(found, amp_device.type)
    assert not unpredicted, "CMP-ATLAS: " + "; ".join(unpredicted)
    assert named == [CONTROL_OP], (
        f"CMP-ATLAS: control: a graph whose {CONTROL_OP} returns float32 must be named by "
        f"{CONTROL_OP} alone among the {len(chunk)} ops of its graph, got {named}"
    )
