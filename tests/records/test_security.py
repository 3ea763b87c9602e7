"""What the harness exposes: no secret of the environment in anything it records, and nothing
listening beyond loopback. (`amp-harness ui` binding 127.0.0.1 by default is tested in
tests/cli/test_cli.py; the MLflow and PostgreSQL servers of the tests bind it in
tests/helpers/servers.py.)"""

from __future__ import annotations

import ipaddress
import math
import socket
import time
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist
from helpers.servers import MlflowServer, free_port

from harness import cli
from harness.lab import devices
from harness.lab.distributed import run_ranks
from harness.records import fingerprint
from harness.records.tracking import redact

SECRETS = {
    "MLFLOW_TRACKING_TOKEN": "amp-secret-123",
    "MLFLOW_TRACKING_PASSWORD": "amp-secret-password-456",
    "AWS_SECRET_ACCESS_KEY": "amp-secret-aws-789",
    "HF_TOKEN": "hf_ampSecret000",
    "DATABASE_URL": "postgresql://amp:amp-secret-db-321@db.internal/mlflow",
}
VISIBLE = "amp-visible-marker-654"  # logged on purpose: proves the search reads what is logged

SCENARIO = f"""
import pytest

@pytest.mark.claim("FMT-BYTES")
def test_bytes(record):
    record.param(note="{VISIBLE}")
    record.verdict("FMT-BYTES", "confirmed", "fp16 2 bytes, fp32 4 bytes")
"""


def holding(folder: Path, text: str) -> list[str]:
    """The files under `folder` whose bytes contain `text` (the SQLite store included)."""
    needle = text.encode()
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if p.is_file() and needle in p.read_bytes())  # fmt: skip


@pytest.mark.slow
def test_no_secret_of_the_environment_reaches_mlflow_or_the_journal(pytester, monkeypatch):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the embedded store
    pytester.makepyfile(**{"scenarios/test_scn": SCENARIO})
    reports = pytester.path / "reports"
    result = pytester.runpytest_inprocess(
        "scenarios", "--amp-device=cpu", "-p", "no:cacheprovider", f"--amp-reports={reports}"
    )
    result.assert_outcomes(passed=1)
    assert "journal.jsonl" in holding(reports, VISIBLE) and "mlflow.db" in holding(reports, VISIBLE)
    leaks = {name: holding(reports, value) for name, value in SECRETS.items()}
    assert leaks == {name: [] for name in SECRETS}, f"secrets recorded: {leaks}"


def test_the_fingerprint_is_an_allow_list(monkeypatch):
    device = devices.probe("cpu")
    before = fingerprint.collect(device, Path.cwd())
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    after = fingerprint.collect(device, Path.cwd())
    assert after.keys() == before.keys()
    assert not [v for v in after.values() if any(s in v for s in SECRETS.values())]


def test_a_password_in_the_tracking_uri_is_not_recorded(pytester):
    pytester.makepyfile(**{"scenarios/test_scn": SCENARIO})
    reports = pytester.path / "reports"
    result = pytester.runpytest_inprocess(
        "scenarios", "--amp-device=cpu", "-p", "no:cacheprovider", f"--amp-reports={reports}",
        "--no-mlflow", "--tracking-uri=http://amp:amp-secret-uri-987@127.0.0.1:9",
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    assert holding(reports, "amp-secret-uri-987") == []


# --- listening sockets -----------------------------------------------------------------------


def listening_addresses(ctx) -> list[str]:
    """Every address this rank listens on, once its process group has communicated."""
    dist.all_reduce(torch.ones(1))
    connections = psutil.Process().net_connections(kind="inet")
    return sorted({c.laddr.ip for c in connections if c.status == psutil.CONN_LISTEN})


def not_loopback(ranks: list[list[str]]) -> list[str]:
    return [ip for rank in ranks for ip in rank if not ipaddress.ip_address(ip).is_loopback]


def other_interface() -> str | None:
    """A network interface with an IPv4 address that is not loopback, if the machine has one."""
    for name, addresses in psutil.net_if_addrs().items():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return name
    return None


@pytest.mark.slow
def test_gloo_ranks_listen_on_loopback_only(monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    ranks = run_ranks(listening_addresses, 2, "cpu", timeout_s=120)
    assert all(ranks), f"no listening socket seen: {ranks}"  # gloo listens: the probe sees it
    assert not_loopback(ranks) == [], (
        f"gloo ranks listen on {not_loopback(ranks)}: reachable from the network while the "
        "distributed scenarios run"
    )


@pytest.mark.slow
def test_the_listening_probe_sees_a_rank_bound_elsewhere(monkeypatch):
    """Negative control of the test above: gloo told to use another interface is caught."""
    interface = other_interface()
    if interface is None:
        pytest.skip("this machine has no network interface besides loopback")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", interface)  # spawned ranks inherit it
    assert not_loopback(run_ranks(listening_addresses, 2, "cpu", timeout_s=120))


# --- passwords in tracking URIs ---------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "http://amp:amp-secret-1@db:5000/x",
        "http://:amp-secret-1@db:5000",  # no user name, only a password
        "--tracking-uri=http://:amp-secret-1@db:9",
        "postgresql+psycopg://mlflow:p%40ss-amp-secret-1@db:5432/mlflow",  # percent-encoded
        "http://amp:p@ss-amp-secret-1@db/x",  # a raw @ inside the password
        "https://db/api?password=amp-secret-1&x=1",
        "https://db/api?x=1&access_token=amp-secret-1#top",
        "https://db/?token=amp-secret-1",
        "https://db/?X-Amz-Signature=amp-secret-1&X-Amz-Credential=amp-secret-1",
        "next=http%3A%2F%2Famp%3Aamp-secret-1%40db%2Fpath",  # a URI inside a URI
        "next=http%3A%2F%2F%3Aamp-secret-1%40db%2Fpath",
        "http%3A%2F%2Fdb%2F%3Fpassword%3Damp-secret-1%26a%3Db",
        "MLflow at 'http://amp:amp-secret-1@db:5000': refused",
        # Mistyped shapes (issue 24): one slash, none, three, none encoded, no scheme at all.
        "http:/amp:amp-secret-1@db:9",
        "--tracking-uri=http:amp:amp-secret-1@db",
        "http:///amp:amp-secret-1@db",
        "http%3A%2Famp%3Aamp-secret-1%40db",
        "amp:amp-secret-1@db:5432",
        "MLflow at 'amp:p@ss-amp-secret-1@db:5432/x': refused",
    ],
)
def test_redact_removes_the_password_of_every_form_of_uri(text):
    assert "amp-secret-1" not in redact(text)
    assert "db" in redact(text)  # the host stays: where it went is still said


def test_redact_keeps_what_holds_no_password():
    for text in (
        "http://127.0.0.1:5000/#/experiments/1",
        "sqlite:////tmp/a%3Fb/mlflow.db",
        "mail amp@example.com about http://db:5000/x",
        "https://db/x?page=2&run=7",
    ):
        assert redact(text) == text  # fmt: skip
    assert redact("http://amp:pw@db/x") == "http://amp@db/x"
    assert redact("http://:pw@db/x") == "http://db/x"


EMPTY_USER, USER, DEAD, TOKEN = (f"amp-planted-{n}-{i}" for i, n in
                                 enumerate(("empty", "user", "dead", "token")))  # fmt: skip


@pytest.mark.slow
def test_a_password_in_the_tracking_uri_is_never_written_or_printed(pytester, capfd, tmp_path):
    """Passwords planted in both URI forms (user:pw@ and :pw@, against a live server) and in a
    dead server's URI (user:pw@ and ?token=): every output is searched for them: the terminal
    (stdout, stderr, MLflow's own lines), the journal, the tags and artifacts on the server,
    the report and what `sync` and `report` print."""
    (tmp_path / "server").mkdir()
    server = MlflowServer(tmp_path / "server", free_port())
    try:
        server.start()
        live = [f"http://:{EMPTY_USER}@127.0.0.1:{server.port}",
                f"http://amp:{USER}@127.0.0.1:{server.port}"]  # fmt: skip
        dead = f"http://amp:{DEAD}@127.0.0.1:9/?token={TOKEN}"
        pytester.makepyfile(**{"scenarios/test_scn": SCENARIO})
        reports = pytester.path / "reports"
        printed = []
        for uri in [*live, dead]:
            result = pytester.runpytest_inprocess(
                "scenarios", "--amp-device=cpu", "-p", "no:cacheprovider",
                f"--amp-reports={reports}", f"--tracking-uri={uri}",
            )  # fmt: skip
            result.assert_outcomes(passed=1)
            printed += [result.stdout.str(), result.stderr.str()]
        assert "MLflow: 127.0.0.1" not in printed[0]  # the first session logged to the server
        assert f"MLflow: http://127.0.0.1:{server.port} (experiment" in printed[0]
        assert "http://amp@127.0.0.1:9/?token=***" in printed[4]  # said, with what to run
        for uri in live:
            assert cli.main(["sync", "--reports", str(reports), "--tracking-uri", uri]) == 0
            assert cli.main(["report", "--reports", str(reports), "--tracking-uri", uri]) == 0
        assert cli.main(["sync", "--reports", str(reports), "--tracking-uri", dead]) == 2
        out, err = capfd.readouterr()
        printed += [out, err]
        assert "synced " in out and "report written" in out and "sync stopped" in err
    finally:
        server.stop()
    for secret in (EMPTY_USER, USER, DEAD, TOKEN):
        assert [text for text in printed if secret in text] == [], f"{secret} printed"
        assert holding(reports, secret) == [], f"{secret} written under reports/"
        assert holding(tmp_path / "server", secret) == [], f"{secret} sent to the server"
    assert "index.html" in " ".join(holding(reports, "127.0.0.1"))  # the search reads it


def test_redact_takes_time_linear_in_the_text():
    """Evidence of 100 KB of letters (a hex dump, base64) took 81 s to redact: a scheme could
    start anywhere inside the run. 1 MB of each pathological text now takes 0.1 s. Checked by
    how the time grows, not by seconds (a loaded runner's are anyone's): 16 times the text takes
    16 times as long in linear time, 256 times in quadratic (that regex: 0.04 s at 2,000
    characters, 9.7 s at 32,000). The two sizes are timed alternately, the fastest of five each,
    so that a busy moment of the machine slows both or neither."""
    for unit in ("a", "?pass", "a:b@", "&a", "a%3A"):
        small, large = (unit * (size // len(unit)) for size in (2_000, 32_000))
        fastest = {small: math.inf, large: math.inf}
        for _ in range(5):
            for text in fastest:
                started = time.perf_counter()
                redact(text)
                fastest[text] = min(fastest[text], time.perf_counter() - started)
        growth = fastest[large] / fastest[small]
        assert growth < 64, f"{unit!r}: 16 times the text took {growth:.0f} times as long"


def test_a_password_in_a_mistyped_uri_is_never_written_or_printed(pytester, capfd):
    """`http:/bob:PW@host` (one slash) went into the journal's args and every print;
    `bob:PW@dbhost:5432` (no scheme) into the usage error."""
    secret = "Pa55SECRET-amp-mistyped"
    pytester.makepyfile(**{"scenarios/test_scn": SCENARIO})
    reports = pytester.path / "reports"
    result = pytester.runpytest_inprocess(
        "scenarios", "--amp-device=cpu", "-p", "no:cacheprovider", f"--amp-reports={reports}",
        f"--tracking-uri=http:/bob:{secret}@127.0.0.1:9",
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    for uri in (f"http:/bob:{secret}@127.0.0.1:9", f"bob:{secret}@dbhost:5432"):
        assert cli.main(["sync", "--reports", str(reports), "--tracking-uri", uri]) == 2
    out, err = capfd.readouterr()
    assert "bob@dbhost:5432" in err  # the usage error still names what was given
    printed = [result.stdout.str(), result.stderr.str(), out, err]
    assert [text for text in printed if secret in text] == [], "printed"
    assert holding(reports, secret) == [], "written under reports/"
