"""harness.lab.autocast.atlas and its data: the documented lists per release, how each op is
called, and an op whose autocast rule is broken named as a mismatch."""

from __future__ import annotations

import re

import torch
from helpers.autocast_breaks import mm_without_autocast

from harness.lab import devices
from harness.lab.autocast import atlas as autocast_atlas
from harness.lab.autocast import docs as autocast_docs
from harness.lab.autocast import ops as autocast_ops

CPU = torch.device("cpu")


def lacking(low: torch.dtype) -> dict[str, str]:
    """The ops whose kernel in `low` this CPU lacks, by the capability table (as the atlas
    scenario asks it): what a test may hold of this machine, derived from its probed facts."""
    cpu = devices.probe("cpu")
    needs = autocast_atlas.HARDWARE_KERNELS[("cpu", low)]
    return {op: lack.why for op, need in needs.items() if (lack := cpu.missing(need))}


def test_the_documented_lists_change_in_the_release_the_docs_changed():
    # conv_transpose moved from the CPU's float32 list to its bfloat16 list in 2.5's docs;
    # cholesky and qr left the float32 list in 2.14's.
    assert autocast_docs.documented("cpu", "2.4.1").of("conv_transpose2d") == "float32"
    assert autocast_docs.documented("cpu", "2.5.1+cpu").of("conv_transpose2d") == "lower"
    assert autocast_docs.documented("cpu", "2.13.0+cpu").of("cholesky") == "float32"
    assert autocast_docs.documented("cpu", "2.14.1").of("cholesky") is None
    cuda = autocast_docs.documented("cuda", "2.11.0+cu130")
    assert (cuda.of("mm"), cuda.of("softmax"), cuda.of("cat")) == ("lower", "float32", None)
    assert cuda.banned == ("binary_cross_entropy",) and cuda.note == ""


def test_a_release_beyond_the_documentation_read_says_which_lists_stand_in():
    later = autocast_docs.documented("cpu", "2.15.0")
    assert later.release == "2.14" and "2.15" in later.note and "2.14" in later.note


def test_every_release_read_is_cited_with_its_commit():
    cited = {s["release"] for s in autocast_docs.sources()}
    assert cited == {f"{a}.{b}" for a, b in autocast_docs.releases_read()}
    assert all(re.fullmatch("[0-9a-f]{40}", s["commit"]) for s in autocast_docs.sources())


def test_every_documented_op_has_a_call():
    assert set(autocast_docs.every_documented_op()) <= set(autocast_ops.CALLS)


def test_an_own_autocast_rule_is_told_from_a_listed_op_downstream():
    assert autocast_atlas.own_rule("smooth_l1_loss", "cpu")  # registered, never documented
    assert not autocast_atlas.own_rule("tensordot", "cpu")  # mm's, on the list
    assert not autocast_atlas.own_rule("normalize", "cpu")  # no aten op of that name


def test_an_op_whose_autocast_rule_is_broken_is_named():
    documented = autocast_docs.documented("cpu", torch.__version__)
    with mm_without_autocast():
        atlas = autocast_atlas.measure(CPU, torch.bfloat16, documented)
    lower = autocast_atlas.judge(atlas, documented, lacking(torch.bfloat16))["lower"]
    wrong = [(c.op, c.documented, c.measured) for c in lower if not c.holds and not c.hardware]
    assert wrong == [("mm", "lower", "input")]
    # What this CPU lacks a kernel for is still a mismatch, named with the hardware's reason;
    # an op that lowers here is never excused.
    explained = {c.op: (c.measured, c.hardware) for c in lower if c.hardware}
    assert explained == {op: ("raises", why) for op, why in lacking(torch.bfloat16).items()}


def test_a_raise_the_hardware_does_not_explain_is_a_plain_mismatch(monkeypatch):
    """The control of the above: an op that raises where its kernel is there (or for a reason
    the hardware does not give) carries no hardware reason."""
    documented = autocast_docs.documented("cpu", torch.__version__)

    def under_autocast_only(real):
        def broken(*args, **kwargs):
            if torch.is_autocast_enabled("cpu"):
                raise RuntimeError("no kernel")
            return real(*args, **kwargs)

        return broken

    for name in ("lstm", "mm"):
        monkeypatch.setattr(torch, name, under_autocast_only(getattr(torch, name)))
    atlas = autocast_atlas.measure(CPU, torch.bfloat16, documented)
    lower = autocast_atlas.judge(atlas, documented, {"mkldnn_rnn_layer": "no kernel here"})
    found = {c.op: c.hardware for c in lower["lower"] if not c.holds}
    assert found == {"mkldnn_rnn_layer": "no kernel here", "mm": ""}


def test_the_same_op_holds_once_its_rule_is_back():
    documented = autocast_docs.documented("cpu", torch.__version__)
    assert autocast_atlas.measure_op("mm", CPU, torch.bfloat16, mixed=False).behaviour == "lower"
    # Negative control: autocast off, the same call runs in its input's dtype.
    off = autocast_atlas.measure_op("mm", CPU, torch.bfloat16, mixed=False, autocast=False)
    assert off.behaviour == "input" and documented.of("mm") == "lower"


def test_an_op_that_raises_is_an_error_with_its_message(monkeypatch):
    def broken(*_args, **_kwargs):
        raise RuntimeError("no kernel\nsecond line")

    monkeypatch.setattr(torch, "dot", broken)
    result = autocast_atlas.measure_op("dot", CPU, torch.bfloat16, mixed=True)
    assert (result.behaviour, result.error) == ("raises", "RuntimeError: no kernel")
