"""`amp-harness diagnose`: the article's pitfalls measured on a user's model, judged per recipe
from those measurements (a model built to overflow fp16 is flagged, naming its layer; the
harness's MLP is safe in fp16 with scaling; tiny gradients need scaling), and every bad factory
an error naming it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import REPO
from torch import nn

from harness import devices, diagnose
from harness import diagnose_examples as examples
from harness.cli import main
from harness.diagnose import KEEP_IN_FP32, NEEDS_SCALING, SAFE, Subject

STEPS = 4


@pytest.fixture(scope="module")
def fragile() -> diagnose.Diagnosis:
    return diagnose.diagnose(examples.fragile, "cpu", steps=STEPS)


@pytest.fixture(scope="module")
def mlp() -> diagnose.Diagnosis:
    # As a scenario calls it, with the amp_device fixture's DeviceInfo (docs/diagnose.md).
    return diagnose.diagnose(examples.mlp, devices.probe("cpu"), steps=STEPS)


def test_the_fragile_model_names_its_layer_and_recommends_bf16_or_fp32(fragile):
    assert [name for name, _layer in fragile.hot_layers()] == ["amplifier"]
    assert fragile.runs["fp32"].layers["amplifier"].peak > torch.finfo(torch.float16).max
    for recipe in ("amp-fp16", "amp-fp16-noscaler", "half"):
        run = fragile.runs[recipe]
        assert run.status == KEEP_IN_FP32, (recipe, run.reasons)
        assert "keep amplifier in fp32, or use amp-bf16" in run.reasons[0]
    # The overflow measured, not only predicted: the scaler skipped every step.
    scaled = fragile.runs["amp-fp16"]
    assert scaled.first_nonfinite == (1, "amplifier") and scaled.skipped == STEPS
    assert fragile.runs["amp-bf16"].status == SAFE  # fp32's range: the fix it recommends


def test_the_harness_mlp_is_safe_in_fp16_with_scaling(mlp):
    assert mlp.hot_layers() == []
    run = mlp.runs["amp-fp16"]
    assert run.status == SAFE and run.drift < diagnose.DRIFT_MAX and run.skipped == 0
    assert "loss within" in run.reasons[0] and "below fp16's 65504" in run.reasons[0]
    assert mlp.runs["fp32"].status == diagnose.REFERENCE_STATUS


def test_pure_fp16_with_adamw_is_unstable_and_with_sgd_is_not():
    # AdamW's epsilon (1e-8) is 0 in fp16: its update divides by zero once a gradient does.
    runs = {
        optimizer: diagnose.diagnose(
            examples.mlp, "cpu", steps=STEPS, optimizer=optimizer, names=["half"]
        ).runs["half"]
        for optimizer in ("adamw", "sgd")
    }
    assert (
        runs["adamw"].status == diagnose.UNSTABLE
        and "losses non-finite" in runs["adamw"].reasons[0]
    )
    assert runs["sgd"].status == SAFE


class Scaled(nn.Module):
    """The harness's MLP with its output scaled: `scale` 1e-4 makes its gradients tiny."""

    def __init__(self, inner: nn.Module, scale: float):
        super().__init__()
        self.inner, self.scale = inner, scale

    def forward(self, x):
        return self.inner(x) * self.scale


def test_tiny_gradients_need_loss_scaling_and_the_scaler_fixes_it():
    subject = examples.mlp()
    found = diagnose.diagnose(
        Subject(Scaled(subject.model, 1e-4), subject.batches, lambda out, y: subject.loss(out, y)),
        "cpu",
        steps=STEPS,
        names=["amp-fp16", "amp-fp16-noscaler"],
    )
    assert found.runs["fp32"].underflow > diagnose.UNDERFLOW_MAX
    assert found.runs["amp-fp16-noscaler"].status == NEEDS_SCALING
    assert "round to zero in fp16" in found.runs["amp-fp16-noscaler"].reasons[0]
    assert found.runs["amp-fp16"].status == SAFE  # GradScaler: the remedy it names


def test_half_norm_layers_are_flagged_from_their_16_bit_statistics():
    subject = examples.cnn()  # BatchNorm
    found = diagnose.diagnose(subject, "cpu", steps=2, names=["half"])
    run = found.runs["half"]
    bn = [name for name, layer in run.layers.items() if layer.kind == "BatchNorm2d"]
    assert bn and all(run.layers[name].half_state for name in bn)
    assert any("norm layers with 16-bit parameters and statistics" in r for r in run.reasons)


@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_the_other_harness_models_are_safe_under_autocast(name):
    found = diagnose.diagnose(getattr(examples, name), "cpu", steps=2, names=["amp-fp16"])
    assert found.runs["amp-fp16"].status == SAFE, found.runs["amp-fp16"].reasons


# --- bad factories --------------------------------------------------------------------------

FACTORIES = """
import torch
from torch import nn

def not_a_subject():
    return 42

def raises():
    raise ValueError("no data here")

def no_model():
    return ("model", [], lambda o, y: o)

BATCH = (torch.ones(1, 2), torch.zeros(1, dtype=torch.long))

def few_batches():
    return nn.Linear(2, 2), [BATCH], nn.functional.cross_entropy

def bad_loss():
    def loss(out, y):
        raise RuntimeError("shape mismatch in my loss")
    return nn.Linear(2, 2), [BATCH] * 8, loss
"""


def test_an_unknown_recipe_is_an_error_before_the_factory_runs(capsys):
    code = main(
        ["diagnose", "harness.diagnose_examples:mlp", "--recipes", "amp-fp8", "--no-mlflow"]
    )
    assert code == 2 and "unknown recipe 'amp-fp8'" in capsys.readouterr().err


BAD = [
    ("nocolon", "not of the form MODULE:FUNCTION"),
    ("no_such_module_xyz:make", "importing no_such_module_xyz raised ModuleNotFoundError"),
    ("user_factories:missing", "has no function 'missing' (it has: bad_loss, few_batches"),
    ("user_factories:raises", "raised ValueError: no data here"),
    ("user_factories:not_a_subject", "returned int: expected a harness.diagnose.Subject"),
    ("user_factories:no_model", "model is a str, not a torch.nn.Module"),
    ("user_factories:few_batches", "its batches gave 1, diagnose needs 4 (--steps)"),
    ("user_factories:bad_loss", "its first training step failed under fp32: RuntimeError: shape"),
]


@pytest.mark.parametrize(("spec", "says"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_factory_is_an_error_naming_it(tmp_path, monkeypatch, capsys, spec, says):
    (tmp_path / "user_factories.py").write_text(FACTORIES)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    code = main(["diagnose", spec, "--device", "cpu", "--steps", str(STEPS), "--no-mlflow"])
    err = capsys.readouterr().err
    assert code == 2 and f"factory {spec!r}" in err and says in err, err
    assert not (tmp_path / "reports").exists()  # nothing written for a factory that failed


# --- the command: file, MLflow, terminal, report ---------------------------------------------


def test_the_command_keeps_the_diagnosis_in_a_file_in_mlflow_and_in_the_report(tmp_path):
    reports = tmp_path / "reports"

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "harness.cli", *args], cwd=tmp_path, capture_output=True,
            text=True, timeout=300,
        )  # fmt: skip

    ran = cli("diagnose", "harness.diagnose_examples:fragile", "--device", "cpu",
              "--steps", "3", "--reports", str(reports))  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert "amplifier" in ran.stdout and "keep layers in fp32 or use bf16" in ran.stdout
    (saved,) = (reports / "diagnoses").glob("harness.diagnose_examples_fragile-*.json")
    kept = json.loads(saved.read_text())
    assert kept["runs"]["amp-fp16"]["status"] == KEEP_IN_FP32
    assert "in experiment 'amp-harness-diagnose'" in ran.stdout

    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{reports / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("amp-harness-diagnose")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.data.tags["status.amp-fp16"] == KEEP_IN_FP32
    assert run.data.tags["status.amp-bf16"] == SAFE and run.data.params["steps"] == "3"
    # Its file beside the store, as the scenarios' artifacts are: not in MLflow's ./mlruns.
    assert (reports / "mlartifacts" / run.info.run_id / "artifacts" / saved.name).is_file()
    assert not (tmp_path / "mlruns").exists()

    # The report shows it beside the scenarios' ledger.
    scenario = subprocess.run(
        [sys.executable, "-m", "pytest", "scenarios/test_formats.py", "-k", "bytes",
         "--amp-device=cpu", f"--amp-reports={reports}", "-p", "no:cacheprovider", "-q"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert scenario.returncode == 0, scenario.stdout[-2000:]
    built = cli("report", "--reports", str(reports), "--baseline", "none")
    assert built.returncode == 0, built.stderr
    page = (reports / "report" / "index.html").read_text()
    assert 'id="diagnoses"' in page and "harness.diagnose_examples:fragile" in page
    summary = (reports / "report" / "summary.md").read_text()
    assert "- amp-fp16: **keep layers in fp32 or use bf16**: keep amplifier in fp32" in summary


def test_an_unreachable_tracking_server_loses_nothing(tmp_path, capsys):
    code = main(["diagnose", "harness.diagnose_examples:mlp", "--device", "cpu", "--steps", "2",
                 "--recipes", "amp-bf16", "--reports", str(tmp_path),
                 "--tracking-uri", "http://127.0.0.1:9"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "MLflow: not logged" in out
    (saved,) = (tmp_path / "diagnoses").glob("*.json")
    assert out.rstrip().endswith(f"the diagnosis is in {saved}")
