"""Two CPU runs with the same seeds record the same verdicts and the same numbers, exactly.

Each run is its own process (pytester's subprocess session): a fresh hash seed, fresh caches
(scenarios/test_convergence.py caches its training runs per process) and fresh torch state, as
two runs of `amp-harness run` on one machine would have. Wall-clock times are the one thing
allowed to differ, and only in histories named `*time_s`.
"""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import REPO

MODULES = ("test_grad_scaler.py", "test_convergence.py")
SELECTION = "grad_scaler or accuracy"  # every GradScaler test and HDL-ACCURACY's training runs
TIMING_SUFFIX = "time_s"
# The convergence scenario's models at a sixth of their training cost: determinism does not
# depend on size, and two runs at full size took 28 s of the suite's 2 cores. Whether these
# sizes still decide HDL-ACCURACY does not matter here: both runs must decide it alike.
SHRINK = """
import pytest

@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    for module in {item.module for item in items if item.module.__name__.endswith("convergence")}:
        small = module.Setup("mlp", 5_000, 50, 64, 3e-3)
        module.SMALL, module.LARGE = (small,), {"cpu": small}
"""


def sessions(pytester: pytest.Pytester) -> list[dict[str, dict]]:
    """The journal's sessions in order, each as {test node id: record}."""
    by_session: dict[str, dict[str, dict]] = {}
    for line in (pytester.path / "reports" / "journal.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if entry["type"] == "session":
            by_session[entry["session_id"]] = {}
        elif entry["type"] == "record":
            by_session[entry["session_id"]][entry["record"]["test"]] = entry["record"]
    return list(by_session.values())


def computed(histories: dict[str, list]) -> dict[str, list]:
    return {k: v for k, v in histories.items() if not k.endswith(TIMING_SUFFIX)}


@pytest.mark.slow
def test_two_cpu_runs_with_the_same_seed_agree_exactly(pytester):
    (pytester.path / "scenarios").mkdir()
    for module in MODULES:
        shutil.copy(REPO / "scenarios" / module, pytester.path / "scenarios" / module)
    pytester.makeconftest(SHRINK)
    for _ in range(2):
        result = pytester.runpytest_subprocess(
            "scenarios", "-k", SELECTION, "--no-mlflow", "--amp-device=cpu",
            "-p", "no:cacheprovider", f"--amp-reports={pytester.path / 'reports'}",
            timeout=300,
        )  # fmt: skip
        assert result.parseoutcomes()["deselected"] == 1, result.outlines[-5:]

    first, second = sessions(pytester)
    assert sorted(first) == sorted(second) and len(first) == 6
    verdicts = 0
    for test, a in first.items():
        b = second[test]
        assert a["outcome"] == b["outcome"], f"{test}: {a['outcome']}, then {b['outcome']}"
        assert a["verdicts"] == b["verdicts"], f"{test}: verdicts differ between two runs"
        assert a["params"] == b["params"], f"{test}: params differ"
        changed = sorted(k for k in a["metrics"] if a["metrics"][k] != b["metrics"].get(k))
        assert a["metrics"].keys() == b["metrics"].keys() and not changed, (
            f"{test}: metrics differ between two runs: {changed}"
        )
        assert computed(a["histories"]) == computed(b["histories"]), f"{test}: histories differ"
        verdicts += len(a["verdicts"])
    assert verdicts == 6  # one per test: the comparison was not vacuous
