"""What the harness exposes: no secret of the environment in anything it records, and nothing
listening beyond loopback. (`amp-harness ui` binding 127.0.0.1 by default is tested in
tests/test_cli.py; the MLflow and PostgreSQL servers of the tests bind it in tests/servers.py.)"""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist

from harness import devices, fingerprint
from harness.distributed import run_ranks

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


def test_gloo_ranks_listen_on_loopback_only(monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    ranks = run_ranks(listening_addresses, 2, "cpu", timeout_s=120)
    assert all(ranks), f"no listening socket seen: {ranks}"  # gloo listens: the probe sees it
    assert not_loopback(ranks) == [], (
        f"gloo ranks listen on {not_loopback(ranks)}: reachable from the network while the "
        "distributed scenarios run"
    )


def test_the_listening_probe_sees_a_rank_bound_elsewhere(monkeypatch):
    """Negative control of the test above: gloo told to use another interface is caught."""
    interface = other_interface()
    if interface is None:
        pytest.skip("this machine has no network interface besides loopback")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", interface)  # spawned ranks inherit it
    assert not_loopback(run_ranks(listening_addresses, 2, "cpu", timeout_s=120))
