"""scenarios/test_compiled_atlas.py can fail, and names what it finds: an op whose compiled dtype
is broken is named alone among the ops that share its graph, in the claim's verdict; a control
that names nothing fails the test. The atlas is cut to a dozen ops here (the whole one compiles
for a minute a dtype)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_fails_naming

from harness.lab import releases
from harness.lab.autocast import compiled_atlas, torch_compile
from harness.lab.autocast import ops as autocast_ops

MODULE = "test_compiled_atlas.py"
FEW = ("mm", "exp", "sigmoid", "softmax", "layer_norm", "sum", "cat", "addmm", "linear",
       "log_softmax", "mse_loss", "matmul")  # fmt: skip
CPU = torch.device("cpu")


@pytest.fixture
def few_ops(monkeypatch):
    """The atlas cut to FEW, its control's graph included (mm is among them)."""
    monkeypatch.setattr(autocast_ops, "CALLS", {n: autocast_ops.CALLS[n] for n in FEW})


def _evidence(folder) -> dict[str, tuple[str, str]]:
    """test id's parameters -> (verdict, evidence) of CMP-ATLAS, from the nested run's journal."""
    found = {}
    for line in (folder / "reports" / "journal.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if entry["type"] == "record":
            record = entry["record"]
            for verdict in record["verdicts"]:
                found[record["test"].split("[")[-1].rstrip("]")] = (
                    verdict["verdict"],
                    verdict["evidence"],
                )
    return found


@pytest.mark.parametrize("target, op", [(torch.mm, "mm"), (torch.sigmoid, "sigmoid")])
def test_an_op_whose_compiled_dtype_is_broken_is_named_alone(target, op):
    """The ops share one graph: a cast after one of them changes its output alone, and the
    comparison says which op and how."""
    found = compiled_atlas.measure(
        CPU, torch.bfloat16, torch_compile.casting_backend(target, torch.float32), ops=list(FEW)
    )
    named = {name: f.mismatches for name, f in found.items() if f.mismatches}
    assert list(named) == [op], named
    assert any("float32" in m and "eager bfloat16" in m for m in named[op]), named[op]


def test_the_unbroken_ops_keep_eager_autocast():
    """Negative control of the above: aot_eager itself changes none of these ops."""
    found = compiled_atlas.measure(CPU, torch.bfloat16, "aot_eager", ops=list(FEW))
    assert {n: f.mismatches or f.error for n, f in found.items() if f.mismatches or f.error} == {}
    assert set(found) == set(FEW)


def test_an_op_that_breaks_the_graph_is_named_not_compiled_and_the_rest_measured():
    """fullgraph: a graph break is named with the error, and the halving keeps its neighbours."""

    def breaks(m):
        x = m(4)
        torch._dynamo.graph_break()
        return x * 2

    ops = {**{n: autocast_ops.CALLS[n] for n in FEW[:5]}, "breaks": breaks}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(autocast_ops, "CALLS", ops)
        found = compiled_atlas.measure(CPU, torch.bfloat16, "aot_eager")
    assert found["breaks"].error and found["breaks"].behaviour == compiled_atlas.NOT_COMPILED
    assert all(not found[n].error and not found[n].mismatches for n in FEW[:5])


def test_a_compiled_mismatch_is_named_in_the_verdict(run_scenario, pytester, monkeypatch, few_ops):
    """aot_eager made to return sigmoid in float32: the claim is partly, naming sigmoid."""
    real = torch_compile.fresh

    def broken(fn, backend, **kwargs):
        if backend == "aot_eager":
            backend = torch_compile.casting_backend(torch.sigmoid, torch.float32)
        return real(fn, backend, **kwargs)

    monkeypatch.setattr(torch_compile, "fresh", broken)
    run_scenario(MODULE, "-k", "bfloat16 and aot_eager").assert_outcomes(passed=1, deselected=3)
    verdict, evidence = _evidence(pytester.path)["bfloat16-aot_eager"]
    assert verdict == "partly", evidence
    assert "sigmoid: from bfloat16: output 0 float32[4], eager bfloat16[4]" in evidence, evidence


def test_a_control_that_names_nothing_fails_the_test(run_scenario, monkeypatch, few_ops):
    monkeypatch.setattr(torch_compile, "casting_backend", lambda *args: "aot_eager")
    result = run_scenario(MODULE, "-k", "bfloat16 and aot_eager")
    assert_fails_naming(result, "CMP-ATLAS")
    result.stdout.fnmatch_lines(["*CMP-ATLAS: control: a graph whose mm returns float32*got []*"])


def test_the_module_passes_on_its_few_ops(run_scenario, pytester, few_ops):
    run_scenario(MODULE, "-k", "aot_eager").assert_outcomes(passed=2, deselected=2)
    for test, (verdict, evidence) in _evidence(pytester.path).items():
        assert verdict == "confirmed", (test, evidence)


def test_a_fixed_bug_on_the_wrong_side_of_its_release_fails_the_test(run_scenario, monkeypatch):
    """multilabel_margin_loss's compiled decomposition, fixed in 2.14: held to the other side of
    the fix than this release's (as if the bug came back, or the fix came early), the test
    fails naming the op."""
    ops = ("mm", "multilabel_margin_loss")
    monkeypatch.setattr(autocast_ops, "CALLS", {n: autocast_ops.CALLS[n] for n in ops})
    real = releases.behaviour

    def other_side(name, device, version=None):
        side = real(name, device, version)
        if name != "multilabel-margin-decomposition":
            return side
        return releases.CURRENT if side == releases.BEFORE else releases.BEFORE

    monkeypatch.setattr(releases, "behaviour", other_side)
    result = run_scenario(MODULE, "-k", "bfloat16 and aot_eager")
    assert_fails_naming(result, "CMP-ATLAS")
    result.stdout.fnmatch_lines(["*CMP-ATLAS: multilabel_margin_loss: predicted*"])
