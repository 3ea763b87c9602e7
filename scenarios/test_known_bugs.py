"""The known-bug ledger, reproduced: each mixed-precision bug PyTorch's tracker documents
(harness/catalogue/known_bugs.toml, docs/known-bugs.md) run on this environment, its verdict
`confirmed` where the harm shows (the bug is present) and `refuted` where it does not.

Claims: every KB-... of the ledger, one test each.

The ledger's bounds say which releases have each bug; a test fails where this release says
otherwise: a harm where the ledger says fixed (a bound is wrong, or the bug came back), or none
where it says present (a bound is wrong, or the reproduction no longer triggers). Each test runs
its reproduction twice, the second time as its control: the same code where the bug cannot occur
(fp32, eager, the documented workaround), which must show no harm, so that a reproduction that
cannot tell the bug apart fails instead of reading as a fix. The reproductions that compile with
torch.compile are in the slow tier (`amp-harness run --all`).
"""

from __future__ import annotations

import pytest

from harness.lab import known_bugs


def _cases():
    for bug, reproduction in sorted(known_bugs.REPRODUCTIONS.items()):
        marks = [pytest.mark.claim(bug)] + ([pytest.mark.slow] if reproduction.slow else [])
        yield pytest.param(reproduction, marks=marks, id=bug)


@pytest.mark.parametrize("reproduction", list(_cases()))
def test_known_bug(record, amp_device, reproduction):
    bug = reproduction.bug
    if amp_device.type not in reproduction.devices:
        pytest.skip(
            f"{bug}'s reproduction runs on {' and '.join(reproduction.devices)} only; this "
            f"session runs on {amp_device.type} (--amp-device)"
        )
    try:
        seen = reproduction.run(amp_device.torch_device, False)
        # Negative control: the same code where the bug cannot occur shows no harm.
        control = reproduction.run(amp_device.torch_device, True)
    except known_bugs.Unavailable as missing:
        wrong = record.known_bug(bug, None, True, f"not run: {missing}")
        assert wrong is None, wrong
        pytest.skip(f"{bug}: {missing}")
    record.metric(**{f"harm/{k}": v for k, v in seen.numbers.items()})
    record.metric(**{f"control/{k}": v for k, v in control.numbers.items()})
    wrong = record.known_bug(
        bug,
        present=seen.harm,
        control_clean=not control.harm,
        evidence=f"{seen.says}; control, {reproduction.control}: {control.says}",
    )
    assert wrong is None, wrong
