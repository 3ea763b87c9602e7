"""`amp-harness diagnose --compile`: each recipe run again with the model compiled and held
against its eager run; a compiled model that computes or trains otherwise is said to differ,
naming how, and one that trains as eager is said to."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._dynamo.backends.debugging import aot_eager

from harness import cli
from harness.lab.autocast import torch_compile
from harness.lab.diagnose import diagnose
from harness.lab.diagnose.examples import mlp

RECIPES = ("fp32", "amp-bf16")


def _rows(backend) -> dict[str, dict]:
    found = diagnose(mlp, "cpu", steps=4, names=RECIPES, compile_backend=backend)
    return {row["recipe"]: row for row in found.compiled["rows"]}


def test_aot_eager_trains_every_recipe_as_eager():
    """The control of the two below: aot_eager changes no dtype and no arithmetic."""
    rows = _rows("aot_eager")
    assert set(rows) == set(RECIPES)
    assert all(row["as_eager"] for row in rows.values()), rows
    assert rows["amp-bf16"]["output_dtype_compiled"] == "bfloat16"


def test_a_compiled_output_in_another_dtype_is_said_to_differ():
    """Every Linear's output cast to float32 inside the graph: under bf16 autocast the compiled
    model's output is float32 where eager's is bfloat16; fp32's is float32 either way."""
    rows = _rows(torch_compile.casting_backend(F.linear, torch.float32))
    assert rows["fp32"]["as_eager"], rows["fp32"]
    assert not rows["amp-bf16"]["as_eager"]
    assert "output is float32 where eager's is bfloat16" in rows["amp-bf16"]["why"]


def test_a_compiled_model_that_trains_otherwise_is_said_to_differ():
    """Outputs scaled by 10 inside the compiled graph: the same dtypes, another training, whose
    loss ends beyond fp32's seed spread from eager's."""

    def scaling(gm, example_inputs):
        run = aot_eager(gm, example_inputs)
        return lambda *args: [t * 10 if t.is_floating_point() else t for t in run(*args)]

    rows = _rows(scaling)
    for recipe in RECIPES:
        assert not rows[recipe]["as_eager"], rows[recipe]
        assert "beyond fp32's own seed spread" in rows[recipe]["why"], rows[recipe]


def test_the_command_says_each_recipe_compiled(capsys, tmp_path):
    code = cli.main(["diagnose", "harness.lab.diagnose.examples:mlp", "--device", "cpu",
                     "--steps", "4", "--recipes", "amp-bf16", "--compile", "aot_eager",
                     "--no-mlflow", "--reports", str(tmp_path)])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "torch.compile (aot_eager): as eager: its loss ends" in " ".join(out.split())
