"""`-W error` or a project's `filterwarnings = error` (issue "Nothing lost, round 3", item 4):
a warning raised inside MLflow's code (SQLAlchemy's deprecation of `noload`, at every store
MLflow opens) became an exception, and MLflow was off in every such session, which then advised
to sync "once MLflow is reachable". The harness's MLflow calls ignore the warnings of the
libraries under them; the user's filters hold everywhere else. None of this relies on the
ignores of this repository's tox.ini: the sessions here run in a folder with an ini of its own,
and the unit tests set their own filters."""

from __future__ import annotations

import warnings
from fnmatch import fnmatch

import pytest
from helpers.tracked import SCENARIOS, runs

from harness.records import tracking
from harness.records.mlflow import bounds
from harness.records.tracking import MlflowSink

# The user's own warnings filter still holds inside the test: only MLflow's calls are exempt.
USERS_OWN_WARNING = """

import warnings

@pytest.mark.claim("FMT-RANGE")
def test_the_users_filter_still_holds(record):
    with pytest.raises(DeprecationWarning):
        warnings.warn("the project's own deprecation", DeprecationWarning)
    record.verdict("FMT-RANGE", "confirmed", "fp16 max 65504")
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("ini", "options"),
    [("[pytest]\n", ["-W", "error"]), ("[pytest]\nfilterwarnings =\n    error\n", [])],
    ids=["-W error", "filterwarnings = error"],
)
def test_warnings_made_errors_leave_mlflow_on(pytester, ini, options):
    """In a process of its own: MLflow's SQLAlchemy warns once per process, when its first store
    is opened, and this process has opened one already."""
    pytester.makepyfile(**{"scenarios/test_scn": SCENARIOS + USERS_OWN_WARNING})
    pytester.makeini(ini)  # the only filters: not this repository's tox.ini with its ignores
    reports = pytester.path / "reports"
    result = pytester.runpytest_subprocess(
        "scenarios", "--amp-device=cpu", "-p", "no:cacheprovider", f"--amp-reports={reports}",
        *options,
    )  # fmt: skip
    result.assert_outcomes(passed=4)
    out = result.stdout.str()
    assert "every result is in the journal" not in out, out  # before: MLflow off
    result.stdout.fnmatch_lines(["MLflow: sqlite:///* (experiment 'amp-harness'); browse with *"])
    children = [r for r in runs(tracking.default_uri(reports)) if r.data.tags["amp.kind"] == "test"]
    assert len(children) == 4 and {r.data.tags["amp.complete"] for r in children} == {"true"}


def warn_from(module: str) -> None:
    """A DeprecationWarning as Python attributes it to a frame of `module`."""
    warnings.warn_explicit("deprecated", DeprecationWarning, f"{module}.py", 1, module=module)


FOREIGN = ["mlflow.store.tracking.sqlalchemy_store", "sqlalchemy.orm", "alembic.util",
           "pydantic._internal", "urllib3.connectionpool"]  # fmt: skip


@pytest.mark.parametrize("module", FOREIGN)
def test_a_warning_inside_an_mlflow_call_never_raises_and_the_filters_stay(module):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        before = list(warnings.filters)
        with tracking.foreign_warnings_ignored():
            warn_from(module)  # ignored: not the harness's
            with pytest.raises(DeprecationWarning):
                warn_from("harness.records.tracking")  # the harness's own use of a library
        assert warnings.filters == before
        with pytest.raises(DeprecationWarning):
            warn_from(module)  # outside the call, the user's filter again


def test_every_call_of_the_client_ignores_them():
    """tracking.client's MLflow client: every reader and writer of the harness goes through it."""

    class Client:
        tracking_uri = "sqlite:///x.db"

        def search_experiments(self):
            warn_from("mlflow.store.tracking.sqlalchemy_store")
            return ["found"]

    bounded = tracking.BoundedClient(Client())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert bounded.search_experiments() == ["found"]
    assert bounded.tracking_uri == "sqlite:///x.db"


def mlflow_failure(tmp_path, monkeypatch, failure: Exception) -> MlflowSink:
    """A sink whose store could not be opened, for `failure`."""

    def fails(uri, set_aside=None):
        raise failure

    monkeypatch.setattr(bounds, "client", fails)  # where the sink looks it up
    sink = MlflowSink(tracking.default_uri(tmp_path), reports=tmp_path)
    assert sink.down
    return sink


def out_of_date() -> Exception:
    from mlflow.exceptions import MlflowException

    return MlflowException("Detected out-of-date database schema (found version 1, expected 2)")


def refused_connection() -> Exception:
    """What MLflow raises for a server that is not there: its own error over requests'."""
    import requests
    from mlflow.exceptions import MlflowException

    try:
        try:
            raise requests.ConnectionError("[Errno 111] Connection refused")
        except requests.ConnectionError as exc:
            raise MlflowException(f"API request to http://h/api failed with exception {exc}")  # noqa: B904 - as MLflow raises it
    except MlflowException as exc:
        return exc


def warning_made_an_error() -> Exception:
    from sqlalchemy.exc import SADeprecationWarning

    return SADeprecationWarning("The ``noload`` loader strategy is deprecated")


@pytest.mark.parametrize(
    ("failure", "advice"),
    [
        (out_of_date, "it is no connection problem: fix what raised "
                      "mlflow.exceptions.MlflowException, then run `amp-harness sync *`"),
        (warning_made_an_error, "it is no connection problem: sqlalchemy.exc.SADeprecationWarning "
                                "is a warning that the warnings filters (-W error, filterwarnings "
                                "= error) made an error: let it warn (-W "
                                "'default::sqlalchemy.exc.SADeprecationWarning'), then run "
                                "`amp-harness sync *`"),
        (refused_connection, "once MLflow is reachable, run `amp-harness sync *`"),
    ],
    ids=["out-of-date-schema", "warning-made-an-error", "refused"],
)  # fmt: skip
def test_the_advice_names_the_cause_of_a_failure(tmp_path, monkeypatch, failure, advice):
    sink = mlflow_failure(tmp_path, monkeypatch, failure())
    assert fnmatch(sink.recovery(), advice), sink.recovery()
