"""Shared fixtures for the tests of the harness itself."""

from __future__ import annotations

import fnmatch
import importlib.metadata
import importlib.util
import os
import shutil
import sys
from pathlib import Path

import _pytest.pytester as pytester_module
import pytest
import torch
from _pytest.pytester import Pytester

# xdist_groups: --dist loadgroup keeps each xdist_group on one worker under pytest 9.2 too.
# slow_left_out: the quick tier (-m "not slow", the README's command) says what it left out.
pytest_plugins = ["pytester", "helpers.xdist_groups", "helpers.slow_left_out"]

REPO = Path(__file__).resolve().parents[1]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--stated-scale",
        action="store_true",
        help="run the scale benchmarks at the scale the README states (sync: 2,020 journal "
        "entries; list and compare: 50,000; the report: 1,000 runs). Without it they run at "
        "a fifth of it or less, with the same checks: a developer's loop and CI stay minutes.",
    )


@pytest.fixture(scope="session")
def stated_scale(request: pytest.FixtureRequest) -> bool:
    """True under --stated-scale: a benchmark runs at the scale whose numbers the README quotes."""
    return request.config.getoption("stated_scale")


def pytest_configure(config: pytest.Config) -> None:
    worker = bool(os.environ.get("PYTEST_XDIST_WORKER"))
    if not worker and config.getoption("dist", "no") != "no":
        return  # the controller of `pytest -n N` runs no test: its workers import what they need
    _keep_installed_modules_across_nested_sessions()
    if worker:
        import torch

        # Workers share the cores: a second intra-op thread per worker, or per process a test
        # starts (`amp-harness diagnose`, a session of its own), only makes OpenMP's waiting
        # threads compete with the other worker: such a test took 40 s instead of 16. (The
        # scenarios set one thread themselves.)
        torch.set_num_threads(1)
        os.environ.setdefault("OMP_NUM_THREADS", "1")


def _keep_installed_modules_across_nested_sessions() -> None:
    """pytester's in-process runs restore sys.modules at their end, dropping every module they
    imported, and a library's module imported a second time breaks: torch's operator
    registrations ("Only a single TORCH_LIBRARY can be used to register the namespace
    quantized_decomposed": a nested session was the first to run torchao's float8 and a later
    test built a transformers model), SQLAlchemy's caches behind MLflow's store, matplotlib's
    figures. pytester keeps zope's and readline's modules for the same reason; here every
    installed distribution's and the standard library's are kept, and a nested session drops
    only what it collected itself (scenario modules, the files a test wrote).
    A kept module keeps the import hooks it put on sys.meta_path too, which pytester would
    restore away: importlib_metadata, imported by MLflow's dependencies, takes distribution
    discovery over from the standard library's finder; without its own finder, the next nested
    session found no distribution and loaded no entry-point plugin."""
    installed = {*importlib.metadata.packages_distributions(), *sys.stdlib_module_names}

    def kept(name: str) -> bool:
        return name.partition(".")[0] in installed

    class PathsKeepingHooks(pytester_module.SysPathsSnapshot):
        def __init__(self) -> None:
            super().__init__()
            self.hooks = list(sys.meta_path)

        def restore(self) -> None:
            added = [hook for hook in sys.meta_path
                     if hook not in self.hooks and kept(type(hook).__module__)]  # fmt: skip
            super().restore()
            sys.meta_path.extend(added)

    take = "_Pytester__take_sys_modules_snapshot"
    assert hasattr(Pytester, take), f"pytest no longer has Pytester.{take}: see this function"
    setattr(Pytester, take, lambda _pytester: pytester_module.SysModulesSnapshot(preserve=kept))
    pytester_module.SysPathsSnapshot = PathsKeepingHooks


@pytest.hookimpl(trylast=True)  # after pytest's own order (by fixture)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `pytest -n N --dist loadgroup` (the README's and CI's commands) each xdist worker
    is handed the next test as it frees up, in the order of the collection: the tests marked
    slow go first, so that the long ones start early and run side by side while the short ones
    fill the gaps, instead of one long test starting last and keeping the whole suite waiting
    for it. (xdist's default, --dist load, sends each worker a run of consecutive tests at once:
    with this order, the slow ones would queue up on one worker.)"""
    if getattr(config.option, "loadgroup", False):  # set on the workers of --dist loadgroup
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def outside_xdist(monkeypatch):
    """Every test's nested pytest sessions (pytester, pytest.main, a subprocess) are not xdist
    workers though this one may be: pytest-benchmark disables itself where PYTEST_XDIST_WORKER
    is set, so the nested session would write no benchmark JSON, and on worker gw0 it warns at
    the nested session's end, an error under our filterwarnings that cuts that session's
    unconfigure short and leaves its log file (/dev/null) open, a ResourceWarning in whichever
    test the garbage collector then finds it. Module-scoped fixtures run before this one: a
    nested session there removes these variables itself (tests/lab/machine/test_capabilities.py)."""
    for name in [n for n in os.environ if n.startswith("PYTEST_XDIST_")]:
        monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def true_device_probes():
    """Every test starts with the probes of the real torch in the process's cache, and leaves
    them there: a test that probes under its monkeypatch (a faked GPU whose every probe "ran", a
    broken autocast) must not leave what it faked to the later tests of its worker. Seen in CI:
    a CPU said to run a bf16 LSTM, cached while a test faked a GPU, failed a test two files on.
    Autouse, this runs before the test's own fixtures patch anything and after they undo it. A
    deferred probe the test ran (devices.DEFERRED_PROBES) is forgotten too: it may have run
    under the patch; run again, it takes milliseconds (inductor's kernels are cached on disk)."""
    from harness.lab import devices

    types = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    held = {device_type: devices.probe(device_type) for device_type in types}
    probed = {device_type: set(info.capabilities) for device_type, info in held.items()}
    yield
    if devices.probe.cache_info().currsize != len(types) or any(
        devices.probe(device_type) is not info for device_type, info in held.items()
    ):
        devices.probe.cache_clear()
        return
    for device_type, info in held.items():
        for need in set(info.capabilities) - probed[device_type]:
            del info.capabilities[need]


@pytest.fixture(scope="session")
def empty_store(tmp_path_factory) -> Path:
    """A store with MLflow's tables and nothing in them, made once per process as the harness
    makes one; tests/helpers/tracked.py's store_in copies it. A copy costs milliseconds, a new
    store 1-2 s of MLflow's migrations: for the tests about what happens in a store, not about a
    store being made (tests/records/mlflow/test_tracking.py and test_half_made_store.py try
    that)."""
    from harness.records.tracking import client

    store = tmp_path_factory.mktemp("empty-store") / "mlflow.db"
    client(f"sqlite:///{store}").search_experiments()
    return store


@pytest.fixture(scope="module")
def one_thread():
    import torch

    # Models this small gain nothing from intra-op threads, and when other processes share the
    # cores, OpenMP's waiting threads make each step ten times slower or worse.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def run_scenario(pytester: pytest.Pytester, request: pytest.FixtureRequest):
    """Run a scenario module of this repository in a nested, in-process pytest session.

    In-process, so a monkeypatch of torch made by the calling test applies inside the scenario:
    that is how tests/ shows each scenario fails when the behaviour it checks is broken.
    Journal only (no MLflow), on the CPU, reports under the pytester folder.
    """
    from harness.lab import devices

    # The plugin probes the device (with torch.autocast, Module.to, GradScaler, ...) once per
    # process: probe now, before the test patches torch, so that a patch reaches the scenario's
    # measurement and not what the device is said to be capable of (a skip instead of a failure).
    devices.probe("cpu")
    # Where the harness is not installed (an offline GPU runner: scripts/gpu-check loads the
    # plugin with -p), no entry point loads it in the nested session either: name it there too.
    plugin = (
        [] if request.config.pluginmanager.has_plugin("amp_harness") else ["-p", "harness.plugin"]
    )

    def run(module: str, *args: str, plugins: tuple = ()) -> pytest.RunResult:
        target = pytester.path / "scenarios"
        target.mkdir(exist_ok=True)
        shutil.copy(REPO / "scenarios" / module, target / module)
        return pytester.runpytest_inprocess(
            f"scenarios/{module}",
            "--no-mlflow",
            "--amp-device=cpu",
            "--amp-isolate=none",  # in this process, where the test's monkeypatch is
            f"--amp-reports={pytester.path / 'reports'}",
            "-p",
            "no:cacheprovider",
            *plugin,
            *args,
            plugins=list(plugins),
        )

    return run


class Toy:
    """A pytest plugin that shrinks a scenario module's sizes once it is imported."""

    def __init__(self, **sizes):
        self.sizes = sizes

    def pytest_collection_modifyitems(self, items):
        for module in {item.module for item in items}:
            for name, value in self.sizes.items():
                assert hasattr(module, name), f"{module.__name__} has no {name} to shrink"
                setattr(module, name, value(module) if callable(value) else value)


def load_scenario(module: str):
    """A scenario module imported by path, for testing its pure decision functions on the CPU."""
    spec = importlib.util.spec_from_file_location(
        f"scenario_{Path(module).stem}", REPO / "scenarios" / module
    )
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = loaded  # dataclasses look their module up there
    spec.loader.exec_module(loaded)
    return loaded


def assert_fails_naming(
    result: pytest.RunResult, claim: str, failed: int = 1, passed: int = 0
) -> None:
    """The nested scenario run failed, and an assertion of it starts with the claim ID, as the
    contract asks ("E   AssertionError: NUM-UNDERFLOW: ..."), not merely printing the ID."""
    result.assert_outcomes(failed=failed, passed=passed)
    assert any(line.startswith("E ") and f"{claim}:" in line for line in result.outlines), (
        f"no assertion naming {claim} in the failure output"
    )


def assert_failed_on(result: pytest.RunResult, pattern: str) -> None:
    """The nested run failed on an assertion whose message matches `pattern` (fnmatch): on an
    "E" line, not in the scenario's source, which the traceback shows too (with every
    assertion's message in it), whichever assertion failed."""
    errors = [line for line in result.outlines if line.startswith("E ")]
    assert any(fnmatch.fnmatch(line, pattern) for line in errors), (pattern, errors)


def half_in_larger_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the `half` recipe's fp16 parameters views of buffers twice their size: their dtype
    and shape say 2 bytes a value, their storages hold 4 (what harness.lab.measure.state_bytes
    reads), as if fp16 saved no memory."""
    import torch

    from harness.lab import recipes

    prepare = recipes.Precision.prepare

    def prepare_in_larger_buffers(self, model):
        model = prepare(self, model)
        if self.recipe.param_dtype == torch.float16:
            with torch.no_grad():
                for p in model.parameters():
                    buffer = torch.empty(2 * p.numel(), dtype=p.dtype, device=p.device)
                    p.data = buffer[: p.numel()].view_as(p).copy_(p)
        return model

    monkeypatch.setattr(recipes.Precision, "prepare", prepare_in_larger_buffers)


def predict_as_before_every_change(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every harness.lab.releases change predict its old behaviour, as on a release before
    it: on this torch, which has today's, the scenario predicting per release must then fail
    (an unexpected result still fails)."""
    from harness.lab import releases

    monkeypatch.setattr(releases, "behaviour", lambda *_args, **_kw: releases.BEFORE)


def promote_layer_norm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make CPU autocast run layer_norm as CUDA's does, on its fp32 list: fp32 compute and an
    fp32 output, so its error drops from the fp16 level to the fp32 one."""
    import torch
    import torch.nn.functional as F

    layer_norm = F.layer_norm

    def promoted(x, *args, **kwargs):
        x = x.float() if torch.is_autocast_enabled(x.device.type) else x
        return layer_norm(x, *args, **kwargs)

    monkeypatch.setattr(F, "layer_norm", promoted)


def unscale_without_dividing(self, optimizer) -> None:
    """A broken GradScaler.unscale_: it still looks for inf/NaN (so step can skip) and marks the
    optimizer unscaled, but leaves the gradients scaled."""
    from torch.amp.grad_scaler import OptState

    if not self.is_enabled():
        return
    self._check_inf_per_device(optimizer)
    self._per_optimizer_states[id(optimizer)]["stage"] = OptState.UNSCALED
