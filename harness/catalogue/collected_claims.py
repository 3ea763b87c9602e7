"""The claims only pytest can read: those of `pytest.param(..., marks=...)` and of markers built
by a function or kept in a variable, which scenario_source.py cannot read from the source. The
module is collected, never run, in this process, and each test's claim markers are noted."""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

import pytest


class MarkerReader:
    """A pytest plugin noting the claim markers of every function collected, before the harness
    plugin can refuse the module for them (its check runs on the finished collect report)."""

    def __init__(self) -> None:
        self.claims: dict[tuple[Path, str], set[str]] = {}
        self.errors: dict[Path, str] = {}
        self.root = Path.cwd()

    def pytest_configure(self, config: pytest.Config) -> None:
        self.root = config.rootpath

    @pytest.hookimpl(wrapper=True)
    def pytest_pycollect_makeitem(self, collector, name, obj):
        items = yield
        for item in items if isinstance(items, list) else []:
            cls = item.getparent(pytest.Class)
            test = f"{cls.name}.{item.originalname}" if cls else item.originalname
            ids = {i for marker in item.iter_markers("claim") for i in marker.args}
            self.claims.setdefault((Path(item.path).resolve(), test), set()).update(ids)
        return items

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            path = (self.root / report.nodeid.split("::")[0]).resolve()
            self.errors[path] = report.longreprtext


def collect(paths: list[Path]) -> MarkerReader:
    """Collect (never run) the scenario files at `paths`, in this process."""
    reader = MarkerReader()
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # pytest's collection chatter
            pytest.main(
                [*map(str, paths), "--collect-only", "-q", "-p", "no:cacheprovider",
                 "--import-mode=importlib", "--assert=plain", "--no-mlflow", "--amp-device=cpu"],
                plugins=[reader],
            )  # fmt: skip
    finally:
        # importlib mode keeps each module under a name derived from its path: forget them, so
        # that a later check in this process reads the files as they are then.
        for name, module in list(sys.modules.items()):
            if getattr(module, "__file__", None) and Path(module.__file__).resolve() in paths:
                del sys.modules[name]
    return reader
