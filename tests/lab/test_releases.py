"""harness.lab.releases: which side of a known change a torch release is on, and what the
prediction says; harness.reports.differences and the page of what changed across releases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import load_scenario

from harness.cli import main
from harness.common.versions import version_key
from harness.lab import releases
from harness.reports import changes, differences

CHANGE = "half-batchnorm-cpu-variance"


@pytest.mark.parametrize(
    ("version", "device", "side"),
    [
        ("2.5.1+cu124", "cpu", releases.BEFORE),  # measured
        ("2.5.0", "cpu", releases.BEFORE),  # the same release line
        ("2.6.0+cu124", "cpu", releases.CURRENT),  # the first with today's behaviour
        ("2.13.0+cpu", "cpu", releases.CURRENT),
        ("2.5.1", "cuda", releases.CURRENT),  # a CPU kernel's change: CUDA keeps today's
        ("2.3.1", "cpu", releases.CURRENT),  # older than every release measured: unknown
    ],
)
def test_the_side_of_a_change_follows_the_measured_range(version, device, side):
    assert releases.behaviour(CHANGE, device, version) == side


def test_every_change_names_its_claim_and_how_it_was_found():
    from harness.catalogue.claims import catalogue

    for name, change in releases.CHANGES.items():
        assert change.claims and set(change.claims) <= set(catalogue()), name
        assert releases.oldest_seen(change) < change.since, name
        assert change.how and change.before and change.current, name


@pytest.mark.parametrize("version", ["2.5.1", "2.13.0", "2.3.1"])
def test_the_prediction_in_words_never_says_none(version):
    text = releases.describe(CHANGE, "cpu", version)
    assert "None" not in text and version in text


def test_the_fp16_accumulation_model_predicts_the_measured_threshold():
    scenario = load_scenario("test_norm_layers.py")
    momentum = torch.nn.BatchNorm1d(1).momentum
    before = {
        std: scenario._predicted_first_inf(scenario._bn_batch(std, torch.device("cpu")), momentum,
                                           100, releases.BEFORE)
        for std in (45, 47, 257)
    }  # fmt: skip
    assert before == {45: None, 47: 1, 257: 1}  # 2.5.1 measured: finite at 45, inf from 46
    current = scenario._predicted_first_inf(
        scenario._bn_batch(47, torch.device("cpu")), momentum, 100
    )
    assert current is None


def column(label, torch_version, verdict, metric, device="cpu"):
    return differences.Column(
        label=label,
        device=device,
        torch=torch_version,
        verdicts={"PIT2-NORM-HALF": verdict},
        tests={"t::bn": (["PIT2-NORM-HALF"], {"bn/half_lowest_overflowing_std": metric})},
    )


def test_a_key_metric_that_differs_is_a_difference_with_its_known_change():
    found = differences.find(
        ["PIT2-NORM-HALF"],
        [column("a", "2.5.1", "partly", 47.0), column("b", "2.13.0", "partly", 257.0)],
    )
    difference = found["PIT2-NORM-HALF"]
    assert difference.verdicts == []  # the same verdict: only the key metric differs
    assert difference.metrics == [
        ("t::bn: bn/half_lowest_overflowing_std", [("a", "47"), ("b", "257")])
    ]
    assert "torch 2.6" in difference.known[0]
    assert "47 (a) vs 257 (b)" in difference.summary()


def test_equal_key_metrics_and_verdicts_are_no_difference():
    columns = [column("a", "2.13.0", "partly", 257.0), column("b", "2.14.1", "partly", 257.00001)]
    assert differences.find(["PIT2-NORM-HALF"], columns) == {}


def test_a_verdict_that_differs_is_a_difference_without_a_known_change():
    columns = [column("a", "2.13.0", "partly", 257.0), column("b", "2.14.1", "refuted", 257.0)]
    difference = differences.find(["PIT2-NORM-HALF"], columns)["PIT2-NORM-HALF"]
    assert difference.verdicts == [("a", "partly"), ("b", "refuted")]
    assert difference.known == []


def baseline(folder: Path, version: str, lowest: float, verdict: str = "partly") -> None:
    summary = {
        "format": 2,
        "session_id": version,
        "name": version,
        "started": 0,
        "complete": True,
        "lacks": [],
        "fingerprint": {"device": "cpu", "hardware_class": "cpu-x", "torch": version},
        "verdicts": [
            {
                "claim": "PIT2-NORM-HALF",
                "verdict": verdict,
                "stands": True,
                "evidence": f"threshold {lowest}",
                "test": "t::bn",
            }
        ],  # fmt: skip
        "tests": {
            "t::bn": {
                "outcome": "passed",
                "claims": ["PIT2-NORM-HALF"],
                "metrics": {"bn/half_lowest_overflowing_std": lowest, "speed": lowest * 3},
                "key_metrics": ["bn/half_lowest_overflowing_std"],
            }
        },
    }
    (folder / f"cpu_torch-{version}.json").write_text(json.dumps(summary))


def test_the_page_lists_the_change_between_releases_in_version_order(tmp_path, capsys):
    for version, lowest in (("2.13.0", 257.0), ("2.5.1", 47.0), ("2.9.1", 257.0)):
        baseline(tmp_path, version, lowest)
    page = tmp_path / "changes.md"
    assert main(["baseline", "changes", "--baselines", str(tmp_path), "--page", str(page)]) == 0
    text = page.read_text()
    assert "## cpu-x: torch 2.5.1, 2.9.1, 2.13.0" in text
    (row,) = [line for line in text.splitlines() if line.startswith("| PIT2-NORM-HALF")]
    # where the value changed, then each side with the releases that had it
    assert (
        "| 2.5.1 → 2.9.1 | bn/half_lowest_overflowing_std = 47 (2.5.1) | "
        "bn/half_lowest_overflowing_std = 257 (2.9.1 to 2.13.0) |"
    ) in row
    assert "Known change in torch 2.6" in row and "speed" not in row  # key metrics only


def test_the_page_says_when_nothing_differs(tmp_path):
    for version in ("2.13.0", "2.14.1"):
        baseline(tmp_path, version, 257.0)
    assert "No claim's verdict or key metric differs" in changes.page(tmp_path)


def test_no_baseline_is_a_clear_error(tmp_path, capsys):
    assert main(["baseline", "changes", "--baselines", str(tmp_path)]) == 2
    assert "no baseline (*.json) to read" in capsys.readouterr().err


def test_the_committed_page_is_what_the_committed_baselines_generate(monkeypatch):
    root = Path(__file__).parents[2]
    committed = root / "docs" / "what-changed-across-releases.md"
    folder = root / "reports" / "baselines"
    if not list(folder.glob("*.json")):
        pytest.fail(f"no baselines in {folder}: the ledger across releases is committed there")
    # From the repository root, as the command in the message writes it: the page cuts long
    # evidence at a length that counts the folder's path, so an absolute one cuts elsewhere.
    monkeypatch.chdir(root)
    assert committed.read_text(encoding="utf-8") == changes.page(Path("reports/baselines")), (
        "docs/what-changed-across-releases.md is stale: run `amp-harness baseline changes "
        "--page docs/what-changed-across-releases.md`"
    )


def test_versions_order_as_numbers():
    versions = ["2.13.0+cpu", "2.4.1+cu121", "2.14.1", "2.9.1+cu128"]
    assert sorted(versions, key=version_key) == [
        "2.4.1+cu121", "2.9.1+cu128", "2.13.0+cpu", "2.14.1",
    ]  # fmt: skip
