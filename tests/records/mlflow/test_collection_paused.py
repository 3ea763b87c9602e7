"""MLflow's import with the cyclic garbage collector held off (issue 56: about 430,000 objects,
all kept, that the collector would scan again and again as they are made), and the collector left
as the caller had it."""

from __future__ import annotations

import gc

import pytest

from harness.records.mlflow import bounds


@pytest.fixture
def collector_restored():
    enabled = gc.isenabled()
    yield
    (gc.enable if enabled else gc.disable)()


@pytest.mark.parametrize("enabled", [True, False], ids=["collector on", "collector off"])
def test_opening_a_store_holds_the_collector_off_and_leaves_it_as_it_was(
    tmp_path, monkeypatch, collector_restored, enabled
):
    seen = []
    opened = bounds._mlflow_client

    def opening(uri, set_aside):
        seen.append(gc.isenabled())
        return opened(uri, set_aside)

    monkeypatch.setattr(bounds, "_mlflow_client", opening)
    (gc.enable if enabled else gc.disable)()
    client = bounds.client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert client.search_experiments()  # the store works: its Default experiment
    assert seen == [False]
    assert gc.isenabled() is enabled
