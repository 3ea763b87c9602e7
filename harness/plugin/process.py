"""What the plugin sets up in this process before any test runs, and puts back after: the GPU a
pytest-xdist worker sees, the project's claims, SIGTERM taken as Ctrl-C, the CPU kernels' class,
the probed device, inductor's cache folder, and the torch threads of scenarios on the CPU."""

from __future__ import annotations

import getpass
import os
import re
import tempfile
from pathlib import Path

import pytest
import torch

from harness.catalogue import claims
from harness.catalogue.claims import catalogue
from harness.common.errors import HarnessError
from harness.lab import devices, hardware
from harness.plugin.session import AmpSession
from harness.records import stopsignals, torch_state
from harness.records.options import REPORTS


def set_up(config: pytest.Config) -> AmpSession:
    """This process made ready for the session (pytest_configure), and the session's object."""
    _pin_gpu(config)
    scenarios = (config.rootpath / config.getini("amp_scenarios")).resolve()
    # The project's own claims, beside its scenarios; a nested session restores the outer's.
    project = config.getini("amp_claims") or Path(scenarios, claims.PROJECT_FILE)
    config.add_cleanup(claims.use_project(config.rootpath / project))
    config.add_cleanup(stopsignals.as_ctrl_c())  # SIGTERM, SIGHUP: as Ctrl-C
    try:
        _hold_cpu_class(config.getoption("amp_cpu_class"))
        device = devices.with_team_capabilities(
            devices.resolve(config.getoption("amp_device")),
            config.rootpath
            / (config.getini("amp_capabilities") or Path(scenarios, devices.TEAM_CAPABILITIES)),
            guard=torch_state.kept,  # a team's probe: held as a test is, before any test
        )
        catalogue()  # a malformed catalogue stops the session here, with its file and field
    except HarnessError as exc:
        raise pytest.UsageError(str(exc)) from None
    reports = Path(config.getoption("amp_reports") or config.rootpath / REPORTS.default)
    if runs_scenarios(config, scenarios):  # before pytest-xdist's workers start: they inherit it
        _keep_inductor_cache(config, reports.resolve())
    return AmpSession(config, device, reports.resolve(), scenarios)


def runs_scenarios(config: pytest.Config, scenarios: Path) -> bool:
    paths = [config.invocation_params.dir / a.split("::")[0] for a in config.args]
    return any(
        p.resolve().is_relative_to(scenarios) or scenarios.is_relative_to(p.resolve())
        for p in paths
    )


def _torch_default_cache() -> Path:
    """Where inductor caches when no folder is set, as torch computes it (tempdir/torchinductor_
    <user>); torch writes it into the environment the first time it looks (the device's probes
    make it look, through an optimizer step), so that there it is no user's choice."""
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
    return Path(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def _keep_inductor_cache(config: pytest.Config, reports: Path) -> None:
    """torch.compile's inductor builds each graph's kernels (C++ on the CPU, triton on CUDA) in
    seconds and caches them on disk, by default in /tmp/torchinductor_<user>, which a fresh
    runner does not keep: under the reports folder, a later session with the same folder (the
    next run on this machine, a CI job given the last one's reports/) reuses them. Triton's
    follows: inductor puts it under its own where TRITON_CACHE_DIR is unset. A folder the user
    set stands (torch's default in the environment is none). The environment is put back at
    the session's end, so that a session run inside another process leaves it as it found it."""
    default = _torch_default_cache()

    def chosen(name: str) -> bool:
        value = os.environ.get(name)
        return value is not None and not Path(value).resolve().is_relative_to(default.resolve())

    if chosen("TORCHINDUCTOR_CACHE_DIR"):
        return
    before = {n: os.environ.get(n) for n in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    if chosen("TRITON_CACHE_DIR"):
        del before["TRITON_CACHE_DIR"]
    for name in before:
        os.environ.pop(name, None)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(reports / "inductor-cache")

    def put_back() -> None:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    config.add_cleanup(put_back)


def _hold_cpu_class(level: str | None) -> None:
    """--amp-cpu-class: hold this process's CPU kernels (and its workers', which inherit the
    variables) to `level` before any probe runs them, and check that the class is in force."""
    if level is None:
        return
    held = hardware.hold(level)
    try:
        hardware.check_held(level)
    except hardware.NotInForce as exc:
        given = " ".join(f"{name}={value}" for name, value in held.items())
        raise HarnessError(f"--amp-cpu-class {level} ({given}): {exc}") from None


def _pin_gpu(config: pytest.Config) -> None:
    """--amp-gpu-per-worker: this pytest-xdist worker sees only its own GPU (set before CUDA
    starts in this process)."""
    gpus = getattr(config, "workerinput", {}).get("amp_gpus")
    if gpus is None:
        return
    index = int(config.workerinput["workerid"].removeprefix("gw"))
    if index >= len(gpus):
        raise pytest.UsageError(
            f"--amp-gpu-per-worker: {config.workerinput['workercount']} xdist workers but "
            f"{len(gpus)} GPU(s): use -n {len(gpus)} or fewer"
        )
    os.environ["CUDA_VISIBLE_DEVICES"] = gpus[index]


def hold_threads(state: AmpSession) -> None:
    """Scenarios on the CPU run with --amp-cpu-threads torch threads, until release_threads."""
    if state.device.type == "cpu":
        # The scenarios' models are small: a second thread barely helps them, a fixed count
        # makes float reductions (and so the recorded numbers) the same on any machine, and
        # on a shared CPU idle OpenMP threads slow every step several times over.
        state.saved_threads = torch.get_num_threads()
        torch.set_num_threads(state.config.getoption("amp_cpu_threads"))


def release_threads(state: AmpSession) -> None:
    if state.saved_threads is not None:
        torch.set_num_threads(state.saved_threads)
