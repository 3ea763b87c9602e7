"""Warnings torch gives while a scenario runs: kept with the scenario's record, not fatal, in
fields of their own (the metric and the param FIELD), never in a verdict's evidence: the
evidence says what the scenario measured, and a warning is a fact about the release.

A scenario measures what a torch release does. A warning that release gives on the way (torch
2.5's "Applying the CPU mse kernel on half-type tensors", a deprecation of a flag the harness
sets) is a fact about the release worth keeping beside the verdict, not a reason to lose the
verdict: under the ini's `filterwarnings = error` it would turn the test into an error with no
verdict at all. Every other warning keeps the ini's filters, the harness's own included.

Torch's warnings are those attributed to a module of the torch package: `warnings.warn` inside
torch, and the warnings its C++ code raises under a torch Python function (attributed to that
function's module). A C++ warning raised directly under a scenario's own call (`torch.mm(...)`
written in the test) is attributed to the scenario's module and keeps the ini's filters; a
scenario that expects one catches it itself (`pytest.warns`), as API-DEPRECATED does.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

TORCH_MODULES = r"torch(\.|$)"  # matched against the module a warning is attributed to
_TORCH_DIR = Path(torch.__file__).resolve().parent
FIELD = "torch_warnings"  # the record's metric (a count) and param (the messages, " | ")
PARAM_CHARS = 2000  # of the messages kept in a record's param (MLflow takes 6,000)


def _from_torch(caught: warnings.WarningMessage) -> bool:
    try:
        return Path(caught.filename).resolve().is_relative_to(_TORCH_DIR)
    except (OSError, ValueError):
        return False


def describe(caught: warnings.WarningMessage) -> str:
    """The warning as one line: 'UserWarning: text (torch/nn/functional.py:3384)'."""
    where = Path(caught.filename).resolve().relative_to(_TORCH_DIR.parent)
    first = str(caught.message).strip().splitlines()[0] if str(caught.message).strip() else ""
    return f"{caught.category.__name__}: {first} ({where}:{caught.lineno})"


@contextmanager
def torch_warnings_kept() -> Iterator[list[str]]:
    """Inside: torch's warnings are shown (never errors) and collected into the list yielded,
    as `describe` words them, once each; every other warning meets the filters in force
    outside, and one shown (not raised) is passed on to them when the block ends."""
    kept: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.filterwarnings("always", module=TORCH_MODULES)
        try:
            yield kept
        finally:
            others = [w for w in caught if not _from_torch(w)]
            kept += dict.fromkeys(describe(w) for w in caught if _from_torch(w))
    for w in others:  # outside the block: to pytest's own record (its warnings summary)
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
