"""A new embedded store is a copy of an empty one MLflow made (records/mlflow/empty_store.py):
MLflow opens it as its own, its Default experiment's artifacts where MLflow in this process puts
them; a template MLflow cannot open, or a cache that cannot be written, leaves the making to
MLflow, as before."""

from __future__ import annotations

import sqlite3

import pytest

from harness.records.mlflow import empty_store
from harness.records.tracking import MlflowSink, client


@pytest.fixture
def template(tmp_path, monkeypatch):
    """The template's place, in this test's folder rather than the user's cache."""
    path = tmp_path / "cache" / "empty.db"
    monkeypatch.setattr(empty_store, "_template_path", lambda: path)
    return path


def default_location(store) -> str:
    with sqlite3.connect(store) as db:
        return db.execute(
            "SELECT artifact_location FROM experiments WHERE experiment_id = 0"
        ).fetchone()[0]


def test_a_new_store_is_a_copy_mlflow_opens_and_logs_into(tmp_path, template, monkeypatch):
    made_in, used_in = tmp_path / "made-here", tmp_path / "used-here"
    for folder in (made_in, used_in):
        folder.mkdir()
    monkeypatch.chdir(made_in)  # MLflow fixes the Default experiment's folder from the cwd
    first = tmp_path / "a" / "mlflow.db"
    client(f"sqlite:///{first}")
    assert template.exists()  # made once, by MLflow, for this release
    monkeypatch.chdir(used_in)
    second = tmp_path / "b" / "mlflow.db"
    sink = MlflowSink(f"sqlite:///{second}", reports=second.parent)
    assert sink.down is None and sink.experiment_id()
    assert default_location(second).startswith(str(used_in))  # not where the template was made
    assert default_location(first).startswith(str(made_in))


def test_a_template_mlflow_cannot_open_is_remade_by_mlflow(tmp_path, template):
    template.parent.mkdir(parents=True)
    template.write_bytes(b"not a database" * 100)
    store = tmp_path / "mlflow.db"
    sink = MlflowSink(f"sqlite:///{store}", reports=tmp_path)
    assert sink.down is None and sink.experiment_id()
    assert not template.exists()  # forgotten: the next new store makes it again


def test_a_cache_that_cannot_be_written_leaves_the_store_to_mlflow(tmp_path, template):
    template.parent.write_text("a file where the cache's folder would be")  # root cannot either
    store = tmp_path / "mlflow.db"
    assert not empty_store.copy_to(store) and not store.exists()
    sink = MlflowSink(f"sqlite:///{store}", reports=tmp_path)
    assert sink.down is None and sink.experiment_id()
