"""Faults put into the MLflow writer's own process (writer_hooks/sitecustomize.py)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

HOOKS = Path(__file__).resolve().parent / "writer_hooks"


def in_the_writer(monkeypatch, **faults: str) -> None:
    """The writers this test starts get `faults` (AMP_TEST_WRITER_<NAME>=value, see
    writer_hooks/sitecustomize.py)."""
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", str(HOOKS) + (os.pathsep + path if path else ""))
    for name, value in faults.items():
        monkeypatch.setenv(f"AMP_TEST_WRITER_{name.upper()}", value)


def held_until_released(log_records: Callable, folder: Path, timeout: float | None = None):
    """`log_records` (MlflowSink's) with each batch held until FOLDER/release exists, FOLDER/inside
    made as it waits: a server as slow as a test wants. Past `timeout` (None: never) it raises,
    as for a test that never released it."""

    def held(sink, session, records):
        (folder / "inside").touch()
        deadline = None if timeout is None else time.monotonic() + timeout
        while not (folder / "release").exists():
            if deadline is not None and time.monotonic() > deadline:
                raise AssertionError("never released")
            time.sleep(0.01)
        return log_records(sink, session, records)

    return held
