"""A new embedded store made as a copy of an empty one MLflow made (issue 56).

MLflow makes a new SQLite store by running every migration since its first schema: 1.3 to 1.8 s
of CPU, in every first session of a reports folder (every CI job on a fresh checkout) and every
`sync` into a new store. The empty store it makes is the same each time for one MLflow release,
so it is made once per release, in the user's cache (platformdirs), and copied: milliseconds. A
copy is put in place whole (a new name, then a rename), so a process stopped in the middle never
leaves a half-made store; the one thing the copy carries from elsewhere, the artifact folder of
MLflow's Default experiment (fixed by MLflow from the working directory of the process that
made it), is set as MLflow sets it in this process (`adopt`). Where the cache cannot be written,
MLflow makes the store itself, as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

from harness.records import halfmade

log = logging.getLogger(__name__)


def copy_to(store: Path) -> bool:
    """Make `store`, absent or empty, a copy of MLflow's empty store: whether it did."""
    if store.exists() and store.stat().st_size > 0:
        return False
    try:
        template = _template()
        staged = store.with_name(f".{store.name}.copying-{os.getpid()}")
        store.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(template, staged)
        os.replace(staged, store)
    except Exception as exc:  # noqa: BLE001 - an unwritable cache, a full disk: MLflow makes
        # the store itself, and says in its own words what is wrong
        log.debug("MLflow makes the store %s itself (%s)", store, exc)
        return False
    return True


def adopt(mlflow_client) -> None:
    """The Default experiment of a copied store, its artifact folder where MLflow in this
    process puts it (its store's `_get_artifact_location`)."""
    from sqlalchemy import text

    store = mlflow_client._tracking_client.store
    wanted = store._get_artifact_location(0)
    with store.engine.begin() as connection:
        connection.execute(
            text("UPDATE experiments SET artifact_location = :a WHERE experiment_id = 0"),
            {"a": wanted},
        )


def forget(store: Path, uri: str) -> None:
    """A copy MLflow could not open, and its template: removed (they hold nothing of anyone's),
    the template made again at the next copy."""
    halfmade.forget_engine(uri)
    for path in (store, _template_path()):
        with contextlib.suppress(OSError):
            path.unlink()


def _template_path() -> Path:
    import mlflow
    import platformdirs

    folder = platformdirs.user_cache_path("amp-harness") / "mlflow-stores"
    return folder / f"empty-mlflow-{mlflow.__version__}.db"


def _template() -> Path:
    """MLflow's empty store for this release, made where it is missing."""
    path = _template_path()
    if path.exists():
        return path
    from mlflow import MlflowClient

    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix="making-") as made:
        made_store = Path(made) / "mlflow.db"
        uri = f"sqlite:///{made_store}"
        MlflowClient(tracking_uri=uri).search_experiments()
        halfmade.forget_engine(uri)  # MLflow keeps its connections, by URI, for reuse
        os.replace(made_store, path)  # whole or not at all, whoever makes it first
    return path
