"""harness.lab.probes: what each probe reports, on values chosen so the right answer is known, and
that every probe leaves the model (and the dispatch stack) as it found it."""

from __future__ import annotations

import math
from collections import OrderedDict

import pytest
import torch
from torch import nn

from harness.lab import probes


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(OrderedDict(linear=nn.Linear(4, 3), relu=nn.ReLU()))


def test_outputs_report_dtype_headroom_inf_nan_and_the_gradient_dtype():
    net = model()
    x = torch.randn(2, 4)
    with probes.outputs(net) as seen, torch.autocast("cpu", dtype=torch.bfloat16):
        out = net(x)
    out.float().sum().backward()
    assert set(seen) == {"linear", "relu"}
    linear = seen["linear"]
    assert linear.dtype == torch.bfloat16 and linear.grad_dtype == torch.bfloat16
    peak = float(net.linear(x).detach().abs().max())  # fp32 recomputation: bf16 agrees to 1%
    assert linear.max_abs == pytest.approx(peak, rel=1e-2)
    assert linear.headroom == pytest.approx(torch.finfo(torch.bfloat16).max / linear.max_abs)
    assert (linear.inf, linear.nan) == (0, 0)
    assert seen["relu"].grad_max_abs == 1.0  # d(sum)/d(out): every entry 1


def test_an_inf_output_has_no_headroom_and_is_counted():
    with probes.outputs([("scale", nn.Identity())]) as seen:
        pass
    assert seen == {}
    ident = nn.Identity()
    with probes.outputs([("ident", ident)]) as seen:
        ident(torch.tensor([1.0, math.inf, math.nan, -3.0], dtype=torch.float16))
    stats = seen["ident"]
    assert (stats.inf, stats.nan, stats.max_abs, stats.headroom) == (1, 1, 3.0, 0.0)
    assert probes.headroom(torch.tensor([2.0, -4.0], dtype=torch.float16)) == 65504 / 4
    assert probes.headroom(torch.zeros(3)) == math.inf


def test_hooks_are_removed_on_exit_even_after_an_error():
    net = model()
    with pytest.raises(RuntimeError), probes.outputs(net):
        net(torch.randn(2, 5))  # wrong width
    assert all(not m._forward_hooks for m in net.modules())
    with probes.outputs(net) as seen:
        pass
    net(torch.randn(2, 4))
    assert seen == {}  # nothing watched after the block


def test_gradients_count_zeros_fp16_underflow_inf_and_nan():
    net = nn.Linear(2, 2, bias=False)
    net.weight.grad = torch.tensor([[0.0, 1e-6], [1.0, math.inf]])
    stats = probes.gradients(net)
    assert (stats.entries, stats.zero, stats.fp16_underflow, stats.inf, stats.nan) == (
        4,
        1,
        2,
        1,
        0,
    )
    assert stats.zero_fraction == 0.25 and stats.fp16_underflow_fraction == 0.5
    # The edge: fp16's smallest normal, 2**-14, is not an underflow; the value below it is.
    net.weight.grad = torch.tensor([[2.0**-14, 2.0**-14 * (1 - 2**-10)], [1.0, 1.0]])
    assert probes.gradients(net).fp16_underflow == 1


def test_op_log_sees_forward_and_backward_dtypes_and_leaves_the_dispatch_stack():
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    net = model()
    with probes.OpLog() as log, torch.autocast("cpu", dtype=torch.bfloat16):
        net(torch.randn(2, 4)).float().sum().backward()
    assert _get_current_dispatch_mode() is None
    matmuls = log.matmuls()
    assert matmuls and log.matmuls(torch.bfloat16) == matmuls  # forward addmm, backward mm
    assert any(op.name == "addmm" for op in matmuls) and any(op.name == "mm" for op in matmuls)
    with probes.OpLog() as plain:
        net(torch.randn(2, 4)).sum().backward()
    assert plain.matmuls(torch.float32) == plain.matmuls() and not plain.matmuls(torch.bfloat16)


def test_step_gradients_is_a_train_callback():
    net = nn.Linear(2, 1)
    net(torch.ones(1, 2)).sum().backward()
    keep = probes.StepGradients()
    keep(net, None)
    assert keep.steps[0].entries == 3 and keep.steps[0].zero == 0


class _ExpScore(nn.Module):
    """A leaf module, then functional code in the root's own forward: exp, and a mask."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        scores = torch.exp(self.lin(x) * 10)
        return scores.masked_fill(torch.eye(4, dtype=torch.bool)[: len(x)], float("-inf"))


def test_op_ranges_name_every_op_by_its_module_and_find_where_inf_is_made():
    model = _ExpScore()
    with torch.no_grad():
        model.lin.weight.fill_(1.0)  # x of ones: lin gives 4 + bias, exp(40+) overflows fp16
    with probes.op_ranges(model) as log:
        with torch.autocast("cpu", dtype=torch.float16), log:
            out = model(torch.ones(3, 4))
            out.float().sum()  # outside the model: the loss
        calls = log.read()
    keys = [c.key for c in calls]
    assert "lin:addmm" in keys and "model:exp" in keys and "model:masked_fill" in keys
    assert any(k.startswith("loss:") for k in keys)
    made = [c.key for c in calls if c.created]
    assert made[0] == "model:exp"  # the overflow, made from finite inputs
    (fill,) = [c for c in calls if c.key == "model:masked_fill"]
    assert fill.nonfinite and not fill.created  # a mask's -inf is written on purpose
    # The parameters are left out of the inputs: lin's input peak is the activation's, 1.
    (addmm,) = [c for c in calls if c.key == "lin:addmm"]
    assert addmm.input_peak == 1.0
