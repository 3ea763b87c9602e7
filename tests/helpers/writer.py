"""Faults put into the MLflow writer's own process (writer_hooks/sitecustomize.py)."""

from __future__ import annotations

import os
from pathlib import Path

HOOKS = Path(__file__).resolve().parent / "writer_hooks"


def in_the_writer(monkeypatch, **faults: str) -> None:
    """The writers this test starts get `faults` (AMP_TEST_WRITER_<NAME>=value, see
    writer_hooks/sitecustomize.py)."""
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", str(HOOKS) + (os.pathsep + path if path else ""))
    for name, value in faults.items():
        monkeypatch.setenv(f"AMP_TEST_WRITER_{name.upper()}", value)
