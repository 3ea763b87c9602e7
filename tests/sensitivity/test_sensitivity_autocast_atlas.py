"""scenarios/test_autocast_atlas.py can fail, and names what it finds: an op whose autocast rule
is broken is a mismatch named in its claim's verdict; an op that changes dtype with autocast off
fails the negative control."""

from __future__ import annotations

import json

import torch
from conftest import assert_fails_naming
from helpers.autocast_breaks import mm_without_autocast, without_autocast_rule

from harness.lab import devices
from harness.lab.machine import cpu

MODULE = "test_autocast_atlas.py"


def _verdicts(folder) -> dict[tuple[str, str], tuple[str, str]]:
    """(test id, claim) -> (verdict, evidence), from the nested run's journal."""
    journal = folder / "reports" / "journal.jsonl"
    found = {}
    for line in journal.read_text().splitlines():
        entry = json.loads(line)
        if entry["type"] == "record":
            record = entry["record"]
            for verdict in record["verdicts"]:
                test = record["test"].split("[")[-1].rstrip("]")
                found[test, verdict["claim"]] = (verdict["verdict"], verdict["evidence"])
    return found


def test_the_module_passes_unpatched(run_scenario, pytester):
    """bfloat16's lower list holds whole where this CPU has oneDNN's bf16 RNN kernel; where it
    has not (AVX2 and below), its one op is the only mismatch, explained by the hardware."""
    run_scenario(MODULE).assert_outcomes(passed=2)
    verdict, evidence = _verdicts(pytester.path)["bfloat16", "AUTOCAST-LOWER-LIST"]
    if devices.probe("cpu").capabilities["bf16_rnn"].works:
        assert verdict == "confirmed", evidence
    else:
        assert verdict == "partly", evidence
        assert (
            "20 of 21" in evidence
            and "mkldnn_rnn_layer (documented lower, measured "
            "raises; the hardware explains it: it lacks a bfloat16 LSTM"
            in evidence
        ), evidence


def test_a_lost_rnn_kernel_where_the_hardware_has_it_is_a_capability_regression(
    run_scenario, monkeypatch
):
    """nn.LSTM raising under bf16 autocast on a CPU class that runs oneDNN's bf16 RNN (AVX-512
    on) is a regression of the build, never explained by the hardware: the bf16 atlas fails at
    the probe, naming the capability. Forced here on any CPU by reading oneDNN's level as
    avx512-bf16."""
    kernels = dict(cpu.kernels_in_force(), onednn_level="avx512-bf16")
    monkeypatch.setattr(cpu, "kernels_in_force", lambda: kernels)

    def without_bf16(real):
        def lstm(*args, **kwargs):
            if (
                torch.is_autocast_enabled("cpu")
                and torch.get_autocast_dtype("cpu") == torch.bfloat16
            ):
                raise RuntimeError("could not create a primitive descriptor for the LSTM")
            return real(*args, **kwargs)

        return lstm

    # The probe runs nn.LSTM, the atlas torch.lstm: the kernel is gone for both.
    monkeypatch.setattr(torch, "lstm", without_bf16(torch.lstm))
    monkeypatch.setattr(torch.nn.LSTM, "forward", without_bf16(torch.nn.LSTM.forward))
    devices.probe.cache_clear()  # probed again under the patch (true_device_probes undoes it)
    result = run_scenario(MODULE, "-k", "bfloat16")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*capability regression: a bfloat16 LSTM under autocast*"])


def test_an_op_whose_rule_is_broken_is_named_in_the_verdict(run_scenario, pytester):
    with mm_without_autocast():
        run_scenario(MODULE, "-k", "bfloat16").assert_outcomes(passed=1)
    verdict, evidence = _verdicts(pytester.path)["bfloat16", "AUTOCAST-LOWER-LIST"]
    assert verdict == "partly"
    assert "not: mm (documented lower, measured input)" in evidence


def test_an_op_that_lowers_without_autocast_fails_the_control(run_scenario, monkeypatch):
    exp = torch.exp
    monkeypatch.setattr(torch, "exp", lambda x: exp(x).to(torch.bfloat16))
    result = run_scenario(MODULE, "-k", "bfloat16")
    assert_fails_naming(result, "AUTOCAST-LOWER-LIST")


def test_a_rule_broken_where_the_verdict_was_partly_already_fails_the_gate_naming_the_op(
    run_scenario, pytester
):
    """Where the lower list is `partly` already (an AVX2 CPU's mkldnn_rnn_layer; here bmm's
    rule removed in every run, on any CPU), mm losing its rule leaves the verdict `partly`: the
    gate still fails, on mm's own key metric, with nothing in the environment to explain it.
    The control: the same run without mm's break passes the gate."""
    from harness.records.journal import Journal
    from harness.reports import baseline

    with without_autocast_rule("bmm"):
        run_scenario(MODULE, "-k", "bfloat16").assert_outcomes(passed=1)
        journal = Journal(pytester.path / "reports" / "journal.jsonl")
        saved = baseline.save(baseline.summarize(journal), pytester.path / "b", partial=True)
        gate = ["-k", "bfloat16", "--amp-baseline", str(saved), "--amp-fail-on-regression"]
        run_scenario(MODULE, *gate).assert_outcomes(passed=1)
        with mm_without_autocast():
            result = run_scenario(MODULE, *gate)
    assert result.ret != 0
    verdict, evidence = _verdicts(pytester.path)["bfloat16", "AUTOCAST-LOWER-LIST"]
    assert verdict == "partly" and "bmm (documented lower" in evidence, evidence
    result.stdout.fnmatch_lines(
        ["*regressions: 1 *", "*[[]bfloat16]): metric holds/mm 1 -> 0*key metric*nothing in the "
         "environment differs*"]
    )  # fmt: skip
