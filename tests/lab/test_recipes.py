"""Recipes: what each one does to the model, the autocast context, the scaler and TF32."""

from __future__ import annotations

import pytest
import torch

from harness.common.errors import HarnessError
from harness.lab import devices, recipes, tf32

CPU = devices.resolve("cpu")


def one_step(name: str, loss_factor: float = 1.0) -> tuple[recipes.Precision, recipes.StepReport]:
    torch.manual_seed(0)
    with recipes.get(name).bind(CPU) as precision:
        model = precision.prepare(torch.nn.Linear(8, 4))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with precision.forward():
            out = model(precision.cast_input(torch.randn(16, 8)))
            loss = out.float().pow(2).mean() * loss_factor
        precision.backward(loss)
        return precision, precision.step(optimizer)


def test_unknown_recipe_names_the_known_ones_and_the_closest():
    with pytest.raises(HarnessError, match=r"unknown recipe 'amp_fp16'.*closest: amp-fp16"):
        recipes.get("amp_fp16")


def test_tf32_on_the_cpu_is_unsupported_with_a_reason():
    with pytest.raises(recipes.RecipeUnsupported, match=r"recipe tf32 needs CUDA"):
        recipes.get("tf32").bind(CPU)


class OldFlags:
    """torch 2.4-2.8's switches: allow_tf32 only, no fp32_precision."""

    def __init__(self, allow_tf32: bool):
        self.allow_tf32 = allow_tf32


class NewFlags:
    """torch 2.9+'s switches, with the old flag deprecated: reading or setting it warns (an error
    under filterwarnings = error), as a release that drops it would fail."""

    def __init__(self, fp32_precision: str, **children):
        object.__setattr__(self, "fp32_precision", fp32_precision)
        for name, child in children.items():
            object.__setattr__(self, name, child)

    def __getattr__(self, name):
        if name == "allow_tf32":
            raise FutureWarning("allow_tf32 is deprecated: use fp32_precision")
        raise AttributeError(name)

    def __setattr__(self, name, value):
        if name == "allow_tf32":
            raise FutureWarning("allow_tf32 is deprecated: use fp32_precision")
        object.__setattr__(self, name, value)


@pytest.fixture(params=["fp32_precision", "allow_tf32"])
def tf32_api(request, monkeypatch):
    """Each TF32 API in turn, in place of this build's; yields (api, matmul, conv switches)."""
    if request.param == "allow_tf32":
        matmul, cudnn = OldFlags(True), OldFlags(True)
        monkeypatch.setattr(torch.backends.cuda, "matmul", matmul)
        monkeypatch.setattr(torch.backends, "cudnn", cudnn)
        yield request.param, matmul, cudnn
        return
    matmul = NewFlags("tf32")
    conv = NewFlags("tf32")
    monkeypatch.setattr(torch.backends.cuda, "matmul", matmul)
    monkeypatch.setattr(torch.backends, "cudnn", NewFlags("none", conv=conv))
    monkeypatch.setattr(torch.backends, "fp32_precision", "none", raising=False)
    yield request.param, matmul, conv


def _setting(switch) -> object:
    return switch.allow_tf32 if isinstance(switch, OldFlags) else switch.fp32_precision


def test_each_tf32_api_is_driven_and_restored_alone(tf32_api):
    api, matmul, conv = tf32_api
    assert tf32.new_tf32_api() == (api == "fp32_precision")
    before = (_setting(matmul), _setting(conv))
    assert tf32.tf32_flags() == {"cuda.matmul.allow_tf32": True, "cudnn.allow_tf32": True}
    with recipes.get("fp32").bind(CPU):
        off = {"fp32_precision": "ieee", "allow_tf32": False}[api]
        assert (_setting(matmul), _setting(conv)) == (off, off)
        assert tf32.tf32_flags() == {"cuda.matmul.allow_tf32": False, "cudnn.allow_tf32": False}
    assert (_setting(matmul), _setting(conv)) == before  # restored exactly


def test_fp32_precision_none_inherits_then_defaults(monkeypatch):
    # "none" defers to the level above (cudnn, then torch.backends); unset everywhere, torch's
    # defaults: TF32 off for matmuls (since 1.12), on for cuDNN convolutions.
    matmul, conv = NewFlags("none"), NewFlags("none")
    cudnn = NewFlags("none", conv=conv)
    monkeypatch.setattr(torch.backends.cuda, "matmul", matmul)
    monkeypatch.setattr(torch.backends, "cudnn", cudnn)
    monkeypatch.setattr(torch.backends, "fp32_precision", "none", raising=False)
    assert tf32.tf32_flags() == {"cuda.matmul.allow_tf32": False, "cudnn.allow_tf32": True}
    monkeypatch.setattr(torch.backends, "fp32_precision", "tf32")
    assert tf32.tf32_flags() == {"cuda.matmul.allow_tf32": True, "cudnn.allow_tf32": True}
    object.__setattr__(cudnn, "fp32_precision", "ieee")
    assert tf32.tf32_flags() == {"cuda.matmul.allow_tf32": True, "cudnn.allow_tf32": False}


def test_this_builds_tf32_switches_are_restored_after_a_recipe():
    before = tf32.tf32_flags()
    with recipes.get("fp32").bind(CPU):
        assert not any(tf32.tf32_flags().values())
    assert tf32.tf32_flags() == before


@pytest.mark.parametrize(
    ("name", "out_dtype", "param_dtype", "scale"),
    [
        ("fp32", torch.float32, torch.float32, 1.0),
        ("amp-fp16", torch.float16, torch.float32, 65536.0),
        ("amp-fp16-noscaler", torch.float16, torch.float32, 1.0),
        ("amp-bf16", torch.bfloat16, torch.float32, 1.0),
        ("half", torch.float16, torch.float16, 1.0),
    ],
)
def test_each_recipe_on_the_cpu(name, out_dtype, param_dtype, scale):
    with recipes.get(name).bind(CPU) as precision:
        model = precision.prepare(torch.nn.Linear(8, 4))
        with precision.forward():
            out = model(precision.cast_input(torch.randn(2, 8)))
    assert (out.dtype, model.weight.dtype) == (out_dtype, param_dtype)
    _, report = one_step(name)
    assert report.scale == scale and not report.skipped and report.grad_norm > 0


def test_the_scaler_is_bound_to_the_device_not_cuda():
    precision, _ = one_step("amp-fp16")
    assert precision.scaler.is_enabled()  # GradScaler() without a device is disabled on a CPU


def test_grad_norm_is_reported_after_unscaling():
    _, fp32 = one_step("fp32")
    _, amp = one_step("amp-fp16")
    assert amp.grad_norm == pytest.approx(fp32.grad_norm, rel=1e-2)  # not 65536 x larger


def test_an_inf_gradient_is_a_skipped_step_with_a_backed_off_scale():
    precision, report = one_step("amp-fp16", loss_factor=float("inf"))
    assert report.skipped and report.scale == 65536.0
    assert precision.scaler.get_scale() == 32768.0


def test_a_wrapped_timing_arm_runs_with_its_recipes_tf32_flags(tf32_api):
    seen = []
    arm = recipes.get("fp32").bind(CPU).wrap(lambda: seen.append(tf32.tf32_flags()))
    before = tf32.tf32_flags()
    arm()
    assert seen == [{"cuda.matmul.allow_tf32": False, "cudnn.allow_tf32": False}]
    assert tf32.tf32_flags() == before  # restored after the call


# --- a team's own recipe, and several optimizers sharing one scaler -----------------------------


def test_a_team_recipe_built_by_keyword_trains_bf16_parameters_without_autocast():
    bf16 = recipes.Recipe("bf16-params", "bf16 parameters", param_dtype=torch.bfloat16)
    with bf16.bind(CPU) as precision:
        model = precision.prepare(torch.nn.Linear(8, 4))
        with precision.forward():
            out = model(precision.cast_input(torch.ones(2, 8)))
    assert model.weight.dtype == out.dtype == torch.bfloat16
    assert precision.scaler is None and not torch.is_autocast_enabled("cpu")


def test_a_recipe_converts_the_model_and_takes_a_scaler_of_its_own():
    frozen = recipes.Recipe(
        "amp-fp16-small-scale", "fp16 autocast, a scaler starting at 2**10",
        autocast_dtype=torch.float16, needs=("fp16_autocast", "grad_scaler"),
        scaler=lambda device: torch.amp.GradScaler(device, init_scale=2.0**10),
        convert=lambda model: model.requires_grad_(False),
    )  # fmt: skip
    with frozen.bind(CPU) as precision:
        model = precision.prepare(torch.nn.Linear(8, 4))
    assert precision.scaler.get_scale() == 2.0**10
    assert not any(p.requires_grad for p in model.parameters())


def test_a_scaler_factory_that_ignores_the_device_is_refused():
    disabled = recipes.Recipe(
        "x", "x", scaler=lambda device: torch.amp.GradScaler(device, enabled=False)
    )
    with pytest.raises(HarnessError, match=r"recipe x: scaler\('cpu'\) returned .*not an enabled"):
        disabled.bind(CPU)


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"needs": "bf16_autocast"}, r"needs='bf16_autocast': use a tuple.*\('bf16_autocast',\)"),
        ({"param_dtype": torch.int8}, r"param_dtype=torch.int8: use a floating torch.dtype"),
        ({"autocast_dtype": "bf16"}, r"autocast_dtype='bf16': use a floating.*or None"),
        ({"scaler": "yes"}, r"scaler='yes': use True .*False, or a function"),
        ({"convert": 3}, r"convert=3: use a function"),
        ({"summary": " "}, r"summary: say in one line"),
        ({"name": "my recipe"}, r"name: use letters"),
        # Issue 55: accepted when built, then TF32 on, or a failure deep in training.
        ({"tf32": "no"}, r"tf32='no': use True or False"),
        ({"autocast_dtype": torch.float64},
         r"autocast_dtype=torch.float64: .*torch.float16 or torch.bfloat16.*or None"),
        ({"param_dtype": torch.float8_e4m3fn},
         r"param_dtype=torch.float8_e4m3fn: .*torch.float32, .*convert="),
        ({"convert": lambda: None}, r"convert=<function .*>: use a function taking the model"),
    ],
    ids=["needs-a-string", "param-dtype", "autocast-dtype", "scaler", "convert", "summary", "name",
         "tf32-a-string", "autocast-float64", "param-float8", "convert-without-an-argument"],
)  # fmt: skip
def test_a_wrong_recipe_field_names_the_file_the_field_and_the_fix(fields, error):
    with pytest.raises(HarnessError, match=rf"test_recipes.py:\d+: Recipe\(.*{error}"):
        recipes.Recipe(**{"name": "mine", "summary": "my recipe", **fields})


def two_optimizers_one_overflowing(poison: float | None):
    """Two Linears, one SGD each, one amp-fp16 scaler: `poison` put in the second's gradient."""
    torch.manual_seed(0)
    with recipes.get("amp-fp16").bind(CPU) as precision:
        first, second = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
        optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (first, second)]
        before = [m.weight.detach().clone() for m in (first, second)]
        with precision.forward():
            # Means: a sum's gradient, x 65536, would overflow float16 in both Linears.
            loss = first(torch.ones(2, 4)).float().mean() + second(torch.ones(2, 4)).float().mean()
        precision.backward(loss)
        if poison is not None:
            second.weight.grad[0, 0] = poison
        report = precision.step(optimizers)
        pairs = zip((first, second), before, strict=True)
        moved = tuple(not torch.equal(m.weight, b) for m, b in pairs)
        return report, moved, precision.scaler.get_scale()


def test_only_the_overflowing_optimizer_is_skipped_and_the_scale_backs_off_once():
    report, moved, scale = two_optimizers_one_overflowing(float("inf"))
    assert report.skipped_each == (False, True) and report.skipped
    assert moved == (True, False)
    assert (report.scale, scale) == (65536.0, 32768.0)  # one update() after both steps
    # Negative control: without the inf both step, and the scale stays.
    clean, clean_moved, clean_scale = two_optimizers_one_overflowing(None)
    assert clean.skipped_each == (False, False) and not clean.skipped
    assert clean_moved == (True, True) and clean_scale == 65536.0


def test_a_fused_optimizers_skip_is_read_from_the_scalers_check():
    """A fused optimizer takes the inf check into its kernel and its step() always runs: the
    skip is read from the check, not from whether step() was called."""
    with recipes.get("amp-fp16").bind(CPU) as precision:
        model = torch.nn.Linear(4, 4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, fused=True)
        before = model.weight.detach().clone()
        with precision.forward():
            precision.backward(model(torch.ones(2, 4)).float().mean())
        model.weight.grad[0, 0] = float("nan")
        report = precision.step(optimizer)
    assert report.skipped_each == (True,) and torch.equal(model.weight, before)


def test_step_refuses_what_is_not_an_optimizer():
    refused = r"'sgd' is not an optimizer or a list of them"
    with recipes.get("fp32").bind(CPU) as precision, pytest.raises(HarnessError, match=refused):
        precision.step("sgd")


def test_tf32_false_and_true_alone_set_the_flags():
    """The control of tf32='no' (which Python reads as true, and turned TF32 on): a bool."""
    for wanted in (False, True):
        recipe = recipes.Recipe("mine", "my recipe", tf32=wanted)
        with recipe.bind(CPU):
            assert tf32.tf32_flags()["cuda.matmul.allow_tf32"] is wanted


def test_a_convert_that_returns_no_module_names_the_recipe_where_it_was_built():
    """convert=lambda m: None failed deep in training (a NoneType has no .train) naming no recipe
    or field; the model it returns is checked, and the error names the line that built it."""
    recipe = recipes.Recipe("mine", "my recipe", convert=lambda model: None)
    line = recipe.built_at.rsplit(":", 1)[1]
    with recipe.bind(CPU) as precision, pytest.raises(HarnessError) as error:
        precision.prepare(torch.nn.Linear(2, 2))
    assert str(error.value) == (
        f"{__file__}:{line}: Recipe('mine'): convert returned None, not a module: return the "
        "model (a swap made in place returns it too)"
    )
    kept = recipes.Recipe("kept", "my recipe", convert=lambda model: model.requires_grad_(False))
    with kept.bind(CPU) as precision:
        assert isinstance(precision.prepare(torch.nn.Linear(2, 2)), torch.nn.Linear)
