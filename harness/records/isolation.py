"""Crash isolation: one scenario test in its own pytest process.

A segfault, an abort, a CUDA error or a hang in a scenario must not take the session down.
The parent runs `python -m pytest NODEID --amp-worker-output FILE` in a new process group; the
worker runs the test as usual, without tracking, and writes its test reports and its record to
FILE. The parent replays the reports to its own terminal and tracking, and adopts the worker's
pytest-benchmark results, so that --benchmark-json and --benchmark-compare see them; if the worker
died or ran past the timeout, the parent writes the failure itself: the signal or exit code and
the last lines of output.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.records import stopsignals
from harness.records.record import Record

TAIL_LINES = 15


def _benchmark_session(config: pytest.Config):
    """pytest-benchmark's session, where it keeps the results it shows, saves and compares; None
    without the plugin. Its `disabled` is set by --benchmark-disable and under pytest-xdist."""
    return getattr(config, "_benchmarksession", None)


def worker_command(item: pytest.Item, device_type: str, reports: Path, output: Path) -> list[str]:
    """The pytest command line that reruns `item` alone with the same harness options."""
    config = item.config
    options = [
        f"--amp-device={device_type}",
        f"--amp-cpu-threads={config.getoption('amp_cpu_threads')}",
        f"--amp-reports={reports}",  # figures go where the parent's records point
        f"--amp-worker-output={output}",
    ]
    benchmarks = _benchmark_session(config)
    if benchmarks is not None:  # they run in the worker as in the parent, and come back in a file
        options.append(
            "--benchmark-disable"
            if benchmarks.disabled
            else f"--benchmark-json={_benchmarks_file(output)}"
        )
    # Plugins and warning filters given on the command line apply in the worker too.
    args = config.invocation_params.args
    passed = [
        arg
        for previous, arg in zip([None, *args], args, strict=False)  # previous: one behind
        if arg.startswith(("-p", "-W")) or previous in ("-p", "-W")
    ]
    if not config.pluginmanager.has_plugin("amp_harness") and "harness.plugin" not in passed:
        passed += ["-p", "harness.plugin"]  # the plugin was not loaded by its entry point
    path, _, rest = item.nodeid.partition("::")
    target = f"{config.rootpath / path}::{rest}" if rest else str(config.rootpath / path)
    # tee-sys: the test's output is captured for its report and also reaches the log, whose last
    # lines are all that is left of a worker that crashed.
    return [sys.executable, "-m", "pytest", target, "-q", "--no-header", "-p", "no:cacheprovider",
            "--capture=tee-sys",
            *passed, *options]  # fmt: skip


def run(
    item: pytest.Item, device_type: str, reports: Path, timeout_s: float
) -> tuple[list[pytest.TestReport], Record | None]:
    """Run `item` in a worker; its reports (or ones describing how it died) and its record."""
    with tempfile.TemporaryDirectory(prefix="amp-worker-") as tmp:
        output = Path(tmp) / "result.json"
        log = Path(tmp) / "output.log"
        started = time.time()
        with log.open("wb") as sink:
            process = subprocess.Popen(
                worker_command(item, device_type, reports, output),
                cwd=item.config.invocation_params.dir,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # Killed with the session, even by kill -9 (its own group spares it otherwise).
                preexec_fn=stopsignals.end_with_parent(os.getpid(), signal.SIGKILL),
            )
            try:
                code = process.wait(timeout=timeout_s)
                cause = None if output.exists() else _exit_cause(code)
            except subprocess.TimeoutExpired:
                _kill(process)
                cause = f"hung: no result within {timeout_s:g} s, killed"
            except BaseException:  # Ctrl-C reaches the parent only (the worker has its own
                _kill(process)  # session): end the worker too, then let the parent stop
                raise
        if cause is None:
            data = json.loads(output.read_text())
            hook = item.config.hook
            reports = [
                hook.pytest_report_from_serializable(config=item.config, data=d)
                for d in data["reports"]
            ]
            record = Record.from_dict(data["record"]) if data["record"] else None
            _adopt_benchmarks(item.config, _benchmarks_file(output))
            return reports, record
        message = f"{item.nodeid} {cause}; last output:\n" + _last_words(log)
        return _died(item, message, started), None


def _benchmarks_file(output: Path) -> Path:
    return output.with_name("benchmark.json")


def _adopt_benchmarks(config: pytest.Config, path: Path) -> None:
    """Add the benchmarks a worker saved to the parent's pytest-benchmark session, rebuilt as the
    plugin's own records (its Metadata) from the timings in the worker's JSON."""
    session = _benchmark_session(config)
    if session is None or session.disabled or not path.exists():
        return
    from pytest_benchmark.stats import Metadata

    for saved in json.loads(path.read_text())["benchmarks"]:
        fixture = SimpleNamespace(
            **{key: saved[key] for key in ("name", "fullname", "group", "param", "params")},
            extra_info=saved["extra_info"],
            cprofile_stats=None,
            has_error=False,
        )
        adopted = Metadata(fixture, saved["stats"]["iterations"], saved["options"])
        for seconds in saved["stats"]["data"]:  # per iteration already
            adopted.stats.update(seconds)
        session.benchmarks.append(adopted)


def _last_words(log: Path) -> str:
    """The end of a dead worker's output; after a fatal signal, the lines before it and the
    innermost frames of Python's fault handler dump, which say where it happened."""
    lines = log.read_text(errors="replace").strip().splitlines()
    fatal = next((i for i, line in enumerate(lines) if line.startswith("Fatal Python error")), None)
    excerpt = lines[-TAIL_LINES:] if fatal is None else lines[max(0, fatal - 5) : fatal + 10]
    return "\n".join(excerpt or ["(none)"])


def _kill(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _exit_cause(code: int) -> str:
    if code < 0:
        return f"crashed: {how_it_ended(code)}"
    return f"{how_it_ended(code)} before reporting"


def how_it_ended(code: int) -> str:
    """A dead process's return code in words: the signal that killed it, or its exit code."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:  # a real-time signal, which has no name
        return f"killed by signal {-code}"


def _died(item: pytest.Item, message: str, started: float) -> list[pytest.TestReport]:
    """A setup that passed, a call that failed with `message`, a teardown that passed: what the
    terminal and the tracking need to show one failed test."""
    now = time.time()
    keywords = {k: 1 for k in item.keywords}

    def report(when: str, outcome: str, longrepr: str | None) -> pytest.TestReport:
        return pytest.TestReport(item.nodeid, item.location, keywords, outcome, longrepr, when,
                                 duration=now - started, start=started, stop=now)  # fmt: skip

    return [report("setup", "passed", None), report("call", "failed", message),
            report("teardown", "passed", None)]  # fmt: skip
