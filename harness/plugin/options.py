"""What the plugin declares to pytest: its command-line options, its ini keys and its markers."""

from __future__ import annotations

import argparse

import pytest

from harness.lab import devices, hardware
from harness.records.options import BASELINES, EXPERIMENT, REPORTS, TRACKING_URI

WORKER_FLAG = "--amp-worker-output"


def add(parser: pytest.Parser) -> None:
    group = parser.getgroup("amp-harness", "amp-harness: mixed-precision scenarios")
    group.addoption(
        "--amp-device",
        default="auto",
        choices=devices.DEVICE_CHOICES,
        help="device the scenarios run on: auto (CUDA when present), cpu or cuda",
    )
    group.addoption(TRACKING_URI.plugin, **TRACKING_URI.arguments())
    # The folders default to None: read under the project's root (config.rootpath), not the
    # folder pytest was started in.
    group.addoption(REPORTS.plugin, **REPORTS.arguments(default=None))
    group.addoption(EXPERIMENT.plugin, **EXPERIMENT.arguments())
    group.addoption(
        "--amp-cpu-threads",
        type=_positive_int,
        default=1,
        help="torch threads for scenarios on the CPU (default 1: see README)",
    )
    group.addoption(
        "--amp-cpu-class",
        default=None,
        choices=tuple(hardware.HOLD),
        help="hold the CPU kernels (ATen's dispatch, oneDNN, MKL) to this class, to measure a "
        "lower class of CPU on this machine; the class in force is read back from torch and "
        "oneDNN, and a class not in force is an error",
    )
    group.addoption(
        "--no-mlflow",
        action="store_true",
        help="record to the journal only (replay later with `amp-harness sync`)",
    )
    group.addoption(
        "--amp-experimental",
        action="store_true",
        help="mark the session experimental: recorded, tagged amp.experimental=true in MLflow, "
        "and kept out of the team's record (the report's ledger, `baseline save`, `compare "
        "last`); `amp-harness sessions mark ID record` undoes it",
    )
    group.addoption(
        "--amp-experimental-reason",
        default=None,
        metavar="TEXT",
        help="why the session is experimental, recorded with its mark (implies --amp-experimental)",
    )
    group.addoption(
        "--amp-baseline",
        default=None,
        metavar="PATH|auto",
        help="at the end, compare the session with this baseline file; auto: this "
        "environment's in --amp-baselines, as `amp-harness baseline save` names it, else the "
        "nearest earlier torch release of its hardware class, then the nearest class (said)",
    )
    group.addoption(BASELINES.plugin, **BASELINES.arguments(default=None))
    group.addoption(
        "--amp-fail-on-regression",
        action="store_true",
        help="fail the session on an unexplained change against the baseline (--amp-baseline, "
        "auto when not given): not predicted by a known change of the release, gained, "
        "accepted or the hardware's (docs/upgrades.md)",
    )
    group.addoption(
        "--amp-isolate",
        default="auto",
        choices=("auto", "all", "none"),
        help="run scenario tests each in its own process, so that a crash or a hang fails only "
        "that test: auto (tests marked isolated, and GPU tests), all, or none",
    )
    group.addoption(
        "--amp-timeout",
        type=_positive_int,
        default=900,
        help="seconds an isolated scenario test may run before it is killed (default 900)",
    )
    group.addoption(
        "--amp-gpu-per-worker",
        action="store_true",
        help="with pytest-xdist (-n N): give each worker a GPU of its own (CUDA_VISIBLE_DEVICES)",
    )
    group.addoption(WORKER_FLAG, default=None, help=argparse.SUPPRESS)  # internal: a worker
    parser.addini(
        "amp_scenarios", "folder of scenario modules, relative to rootdir", default="scenarios"
    )
    parser.addini(
        "amp_claims",
        "the project's claim catalogue, relative to rootdir (default: amp_scenarios/claims.toml)",
        default="",
    )
    parser.addini(
        "amp_capabilities",
        "the project's own capabilities, relative to rootdir (default: "
        "amp_scenarios/capabilities.py)",
        default="",
    )


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)


def add_markers(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "claim(*ids): the catalogue claim IDs a scenario test checks (amp-harness list)"
    )
    config.addinivalue_line(
        "markers",
        "requires(*capabilities, gpus=0): skip with a reason unless the device has them "
        f"({', '.join(devices.CAPABILITY_TEXT)})",
    )
    config.addinivalue_line(
        "markers",
        "isolated: run in its own process (a crash or a hang fails only this test); GPU tests "
        "are isolated without it",
    )
    config.addinivalue_line(
        "markers",
        "timing: measures speed or memory; refuses to share its device with other xdist workers",
    )
    config.addinivalue_line(
        "markers",
        "slow: in scenarios/, a test that compiles or trains to convergence, tens of seconds on a "
        "2-core CPU: `amp-harness run` leaves it out unless --all (`pytest scenarios/` runs it)",
    )
