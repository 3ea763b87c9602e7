"""`amp-harness diagnose MODULE:FUNCTION`: a user's model trained a few steps under every recipe
(harness.lab.diagnose), judged, each recommended fix tried; the table printed, the diagnosis kept
in a file and in MLflow."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.cli.arguments import command, tracking
from harness.records.tracking import redact, resolve_uri


def add(sub) -> None:
    diag = command(
        sub,
        "diagnose",
        "train a few steps of your model under every recipe and say which are safe, and why",
    )
    diag.add_argument(
        "factory",
        metavar="MODULE:FUNCTION",
        help="a function returning (model, batches, loss), e.g. harness.lab.diagnose.examples:mlp "
        "(docs/diagnose.md)",
    )
    diag.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    diag.add_argument("--steps", type=int, default=8, help="training steps per recipe (8)")
    diag.add_argument("--lr", type=float, default=1e-3, help="learning rate (1e-3)")
    diag.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    diag.add_argument(
        "--verify", type=int, default=0, metavar="N",
        help="then train N steps under each recipe and each recommended fix, and say whether "
        "the quick look's judgement held (the ground truth; slower)",
    )  # fmt: skip
    diag.add_argument(
        "--seeds", type=int, default=1, metavar="K",
        help="with --verify: train every recipe and fix from K initialisations (6 to 16; the "
        "factory's own seeds where it takes `seed`) beside fp32 from the same ones, and call a "
        "gap only where it is consistent (a paired sign-flip test, p < 0.05) and beyond fp32's "
        "seed spread: a gap under a rerun's spread shows; K times --verify's cost",
    )  # fmt: skip
    diag.add_argument(
        "--compile", nargs="?", const="inductor", default=None, metavar="BACKEND",
        help="also run each recipe with the model under torch.compile (inductor, or the backend "
        "named: aot_eager needs no compiler) and say where it does not train as eager",
    )  # fmt: skip
    diag.add_argument(
        "--horizon", type=int, default=1000, metavar="STEPS",
        help="the training length you plan: an op whose growth over the quick look overflows "
        "fp16 within it is said, with the step and the fix (status 'overflows fp16 ahead'; 1000)",
    )  # fmt: skip
    diag.add_argument(
        "--step-timeout", type=float, default=300, metavar="S",
        help="a training step that runs longer is stopped, with an error (300; 0: no limit)",
    )  # fmt: skip
    diag.add_argument(
        "--recipes", nargs="+", default=None, metavar="RECIPE",
        help="default: fp32 amp-fp16 amp-fp16-noscaler amp-bf16 half (fp32 always runs)",
    )  # fmt: skip
    tracking(diag, experiment=False)  # its experiment is its own: diagnoses.EXPERIMENT
    diag.add_argument("--no-mlflow", action="store_true", help="the diagnosis file only")
    diag.set_defaults(handler=_diagnose)


def _diagnose(args: argparse.Namespace) -> int:
    """Measure the factory's model under every recipe the device runs; print the table, then
    keep the diagnosis in a file and in MLflow. Exit 1 when it could not judge (a capability
    regression, an fp32 reference that diverged) or could not keep it."""
    import shutil

    from harness.lab import devices, diagnose
    from harness.reports import diagnoses

    found = diagnose.diagnose(
        args.factory, devices.resolve(args.device, "--device"), steps=args.steps, lr=args.lr,
        optimizer=args.optimizer, names=args.recipes or diagnose.RECIPES, horizon=args.horizon,
        verify=args.verify, seeds=args.seeds, step_limit_s=args.step_timeout or None,
        compile_backend=args.compile,
    )  # fmt: skip
    width = shutil.get_terminal_size((100, 24)).columns
    print(diagnoses.render(found, width, sys.stdout.isatty()), end="")
    broken = [r.recipe for r in found.runs.values() if r.status in diagnose.BROKEN]
    code = 1 if broken else 0
    if broken:
        print(f"diagnose: not judged or regressed: {', '.join(broken)} (see above)",
              file=sys.stderr)  # fmt: skip
    try:
        saved = diagnoses.save(found, Path(args.reports))
    except OSError as exc:
        print(f"diagnose: the diagnosis above was not saved: {exc.strerror or exc} "
              f"({exc.filename or args.reports}); pass --reports a writable folder",
              file=sys.stderr)  # fmt: skip
        return 1
    print(f"diagnosis: {saved}")
    if args.no_mlflow:
        print("MLflow: off (--no-mlflow); the diagnosis is in the file above")
        return code
    try:
        uri = resolve_uri(args.tracking_uri, Path(args.reports))
        run_id = diagnoses.log(found, uri, saved, Path(args.reports))
    except Exception as exc:  # a dead server, an unopenable store: the file holds everything
        print(f"MLflow: not logged ({redact(str(exc))}); the diagnosis is in {saved}")
        return code
    print(f"MLflow: run {run_id} in experiment {diagnoses.EXPERIMENT!r} at {redact(uri)}")
    return code
