"""The autocast atlas: PyTorch's documented autocast op lists, every op measured.

Claims: AUTOCAST-LOWER-LIST, AUTOCAST-FP32-LIST, AUTOCAST-PROMOTE-LIST, AUTOCAST-UNLISTED,
AUTOCAST-GRAD-DTYPE (harness/catalogue/claims_autocast.toml).

The docs of each release list the ops autocast runs in the lower-precision dtype, in float32, or
in the widest input type (harness/lab/autocast/lists.toml, cited per release). Every op those
lists name for either device, and common ops on no list (elementwise, reductions, attention, norms,
losses), is called on the session's device under autocast to each dtype the device has
(harness.lab.autocast.atlas): from float32 inputs, from inputs in the autocast dtype, and, for the
promote list, from both at once. Each op is held against the list the running release documents
for this device, and each mismatch is named (op, documented, measured). Every op's behaviour is
kept as a metric (`op/<name>`: harness.lab.autocast.docs.CODES), which the report's atlas table and
`amp-harness baseline changes` read back across devices and releases.
"""

from __future__ import annotations

import pytest
import torch

from harness.lab import devices
from harness.lab.autocast import atlas as autocast_atlas
from harness.lab.autocast import docs as autocast_docs

CLAIMS = {
    "lower": "AUTOCAST-LOWER-LIST",
    "float32": "AUTOCAST-FP32-LIST",
    "promote": "AUTOCAST-PROMOTE-LIST",
    autocast_docs.NO_LIST: "AUTOCAST-UNLISTED",
    "grads": "AUTOCAST-GRAD-DTYPE",
}
WHAT = {
    "lower": "ops on the lower-precision list computed in {low} from float32 inputs",
    "float32": "ops on the float32 list computed in float32 from {low} inputs",
    "promote": "ops on the promote list ran in float32 from float32 and {low} inputs together",
    autocast_docs.NO_LIST: "ops on no list ran in their input's dtype or changed it only "
    "downstream of a listed op",
    "grads": "ops returned every input's gradient in that input's own dtype",
}


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _verdict(checks: list[autocast_atlas.Check]) -> str:
    held = sum(c.holds for c in checks)
    if not checks:
        return "inconclusive"
    return "confirmed" if held == len(checks) else "refuted" if held == 0 else "partly"


def _evidence(group: str, checks: list[autocast_atlas.Check], low, device, doc) -> str:
    held = sum(c.holds for c in checks)
    text = (
        f"{_short(low)} autocast on {device}, held to the torch {doc.release} docs: {held} of "
        f"{len(checks)} {WHAT[group].format(low=_short(low))}"
    )
    wrong = [
        f"{c.op} (documented {c.documented}, measured {c.measured}"
        + (f"; the hardware explains it: {c.hardware})" if c.hardware else ")")
        for c in checks
        if not c.holds
    ]
    return text + (f"; not: {'; '.join(wrong)}" if wrong else "")


def _lacking(amp_device, low) -> dict[str, str]:
    """The ops whose kernel in `low` this hardware lacks, each with why: a lack the table
    expects here is a capability regression, raised (DeviceInfo.optional)."""
    found = {}
    for op, need in autocast_atlas.HARDWARE_KERNELS.get((amp_device.type, low), {}).items():
        lack = amp_device.optional(need)
        if lack:
            found[op] = f"it lacks {devices.CAPABILITY_TEXT[need]}: {lack.why}"
    return found


# The IDs written out: `amp-harness list` reads markers from the source, without importing torch.
@pytest.mark.claim(
    "AUTOCAST-LOWER-LIST",
    "AUTOCAST-FP32-LIST",
    "AUTOCAST-PROMOTE-LIST",
    "AUTOCAST-UNLISTED",
    "AUTOCAST-GRAD-DTYPE",
)
@pytest.mark.parametrize(
    "low",
    [
        pytest.param(torch.float16, marks=pytest.mark.requires("fp16_autocast"), id="float16"),
        pytest.param(torch.bfloat16, marks=pytest.mark.requires("bf16_autocast"), id="bfloat16"),
    ],
)
def test_the_documented_autocast_lists_hold(record, amp_device, low):
    device = amp_device.torch_device
    doc = autocast_docs.documented(amp_device.type, torch.__version__)
    needs = autocast_atlas.HARDWARE_KERNELS.get((amp_device.type, low), {})
    record.depends_on_hardware(*needs.values())
    lacking = _lacking(amp_device, low)
    atlas = autocast_atlas.measure(device, low, doc)
    checks = autocast_atlas.judge(atlas, doc, lacking)
    record.param(
        autocast_dtype=_short(low),
        documented_release=doc.release,
        documented_note=doc.note or "the running release's own documentation",
        absent=", ".join(atlas.absent) or "none",
        # the report's atlas table marks these cells
        mismatched_ops=",".join(
            c.op
            for group, found in checks.items()
            if group != "grads"
            for c in found
            if not c.holds
        ),
    )
    behaviours = {name: r.behaviour for name, r in atlas.results.items()}
    behaviours.update(dict.fromkeys(atlas.absent, "absent"))
    record.metric(**{f"op/{name}": autocast_docs.CODES[b] for name, b in behaviours.items()})
    record.metric(
        **{
            f"{group.replace(' ', '_')}_mismatches": sum(not c.holds for c in found)
            for group, found in checks.items()
        }
    )
    # Whether each op held to its documented list: which way the behaviour went, op by op, so
    # that a comparison names an op that stopped (or started) holding even where the claim's
    # verdict stays `partly` (an AVX2 CPU's mkldnn_rnn_layer, then mm as well).
    record.key_metric(
        **{
            f"holds/{c.op}": float(c.holds)
            for group, found in checks.items()
            if group != "grads"
            for c in found
        }
    )
    # Negative control: with autocast off, no op leaves its input's dtype, so a "lower" or a
    # "float32" above is autocast's doing and not an artefact of how the dtype is read.
    control = autocast_atlas.measure(device, low, doc, autocast=False)
    changed = [n for n, r in control.results.items() if r.behaviour in ("lower", "float32")]

    anyway = [n for n, r in control.results.items() if r.behaviour == "promote"]
    gone = [f"{op} ({error})" for op, error in atlas.absent.items() if op in doc.lists]
    absent = f"; documented but not callable in this build: {'; '.join(gone)}" if gone else ""
    notes = {
        "promote": f" ({', '.join(anyway)} also without autocast: type promotion)"
        if anyway
        else "",
        "grads": "",
    }
    for group, claim in CLAIMS.items():
        evidence = _evidence(group, checks[group], low, amp_device.type, doc)
        evidence += notes.get(group, absent) + (f"; {doc.note}" if doc.note else "")
        record.verdict(claim, _verdict(checks[group]), evidence)

    assert changed == [], (
        f"AUTOCAST-LOWER-LIST: with autocast off these ops still changed their input's dtype: "
        f"{changed}"
    )
    # Every op the running release documents for this device was measured (or is gone from
    # torch): none is left out of the verdicts.
    unmeasured = set(doc.lists) - set(atlas.results) - set(atlas.absent)
    assert unmeasured == set(), f"AUTOCAST-UNLISTED: documented ops not measured: {unmeasured}"
