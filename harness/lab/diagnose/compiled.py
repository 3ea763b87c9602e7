"""`amp-harness diagnose --compile`: each recipe's quick-look run again with the model compiled,
held against its eager run, so that a model safe in eager and not compiled is said to be.

The compiled run starts from the same weights, sees the same batches and draws the same random
numbers as the eager one (harness.lab.diagnose.runs); only `torch.compile(model, backend=...)`
differs. It differs from eager where:
- it raises (a graph the backend cannot build, an op it lacks in the recipe's dtype);
- the model's output dtype on the first batch, under the recipe's precision, is another;
- its loss goes non-finite where eager's stays finite, or the other way round;
- GradScaler skips another number of steps;
- its loss ends further from eager's than fp32's own seed spread (the diagnosis's noise) and
  further than the drift rule's floor (curves.beyond_noise): the same yardstick a recipe's gap
  to fp32 is held to.
The op observers do not run compiled (they would break the graph): what is compared is what a
user's training sees, the loss and the output.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from harness.lab import recipes
from harness.lab.autocast import torch_compile
from harness.lab.diagnose.curves import beyond_noise, end_gap, loss_floor
from harness.lab.diagnose.observed import REFERENCE, Diagnosis, Run
from harness.lab.diagnose.runs import Replay, Setting, run_recipe


def compare(
    diagnosis: Diagnosis, initial: nn.Module, quick: Replay, setting: Setting, backend
) -> dict:
    """Each recipe that ran, compiled with `backend` (a name, or a torch.compile backend) and
    held against its eager run: {"backend", "rows": [{recipe, as_eager, why, ...}]}."""
    rows = []
    for name, eager in diagnosis.runs.items():
        if eager.unsupported or eager.error:
            continue
        with torch_compile.denormals_kept():  # torch 2.4's inductor kernels turn flush-to-zero on
            run, _ = run_recipe(name, initial, quick, setting, watch=False, backend=backend)
            dtypes = _output_dtypes(name, initial, quick.taken[0], setting, backend)
        as_eager, why = _judge(eager, run, dtypes, diagnosis)
        rows.append({
            "recipe": name, "as_eager": as_eager, "why": why, "loss": run.loss,
            "skipped": run.skipped, "output_dtype_eager": dtypes[0],
            "output_dtype_compiled": dtypes[1],
        })  # fmt: skip
    return {"backend": _name(backend), "rows": rows}


def _name(backend) -> str:
    return backend if isinstance(backend, str) else getattr(backend, "__name__", repr(backend))


def _output_dtypes(
    name: str, initial: nn.Module, batch: tuple, setting: Setting, backend
) -> tuple[str, str]:
    """The dtype of the model's first floating-point output on `batch` under the recipe's
    precision, eager and compiled (a fresh copy each); "raised" where the call raised."""
    found = []
    for compile_with in (None, backend):
        precision = recipes.get(name).bind(setting.device)
        model = copy.deepcopy(initial)
        try:
            with precision:
                model = precision.prepare(model)
                call: Callable = (
                    model
                    if compile_with is None
                    else torch_compile.fresh(model, compile_with, fullgraph=False)
                )
                x = precision.cast_input(batch[0])
                with torch.no_grad(), precision.forward():
                    out = call(x)
            floats = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)
                      and t.is_floating_point()]  # fmt: skip
            found.append(str(floats[0].dtype).removeprefix("torch.") if floats else "none")
        except Exception as exc:  # noqa: BLE001 - what the call raised is the finding
            found.append(f"raised {type(exc).__name__}")
    return found[0], found[1]


def _judge(eager: Run, run: Run, dtypes: tuple[str, str], diagnosis: Diagnosis) -> tuple:
    """(whether the compiled run is eager's within noise, why, in words)."""
    if run.error:
        return False, f"compiled, it raised {run.error}"
    if dtypes[0] != dtypes[1]:
        return False, f"compiled, the model's output is {dtypes[1]} where eager's is {dtypes[0]}"
    finite = [run.first_nonfinite_loss() is None, eager.first_nonfinite_loss() is None]
    if finite[0] != finite[1]:
        went = "goes non-finite" if finite[1] else "stays finite"
        return False, f"compiled, its loss {went} where eager's does not"
    if run.skipped != eager.skipped:
        return False, (
            f"compiled, GradScaler skipped {run.skipped} of {len(run.skips)} steps, eager "
            f"{eager.skipped}"
        )
    if not finite[0]:
        steps = run.first_nonfinite_loss(), eager.first_nonfinite_loss()
        if steps[0] != steps[1]:
            return (
                False,
                f"compiled, its loss goes non-finite at step {steps[0]}, eager's at {steps[1]}",
            )
        return True, f"its loss goes non-finite at step {steps[0]}, as eager's; output {dtypes[1]}"
    gap = end_gap(run.loss, eager.loss)
    base = eager.loss[-1] if eager.loss else 0.0
    if beyond_noise(gap, base, diagnosis.noise, loss_floor(diagnosis.runs[REFERENCE])):
        return False, (
            f"compiled, its loss ends {gap:.3g} from eager's, beyond fp32's own seed spread "
            f"({diagnosis.noise:.3g})"
        )
    return True, (
        f"its loss ends {gap:.3g} from eager's (fp32's seed spread {diagnosis.noise:.3g}); "
        f"output {dtypes[1]}; {run.skipped} steps skipped"
    )
