"""A journal of a year of CI history, written cheaply: sessions of the whole suite (a session
entry, one record per test, a session end), each record shaped as the scenarios write them
(params, metrics, a short history, verdicts whose evidence carries numbers), about 1.2 KB a line
as in the journals the issue measured (50,000 entries, 59 MB). Each line is one template
formatted, not a Record built and dumped: 50,000 lines take about a second."""

from __future__ import annotations

import json
from pathlib import Path

from harness.catalogue.claims import catalogue
from harness.records.record import Record, Verdict
from helpers.sessions import CPU

TESTS = 48  # records per session: the CPU suite's size


def _record_template(claims: list[str]) -> str:
    """One record line with {sid}, {rid}, {test} and {verdict} left to fill in."""
    record = Record("TEST", claims, "cpu", Path("reports/artifacts/RID"), record_id="RID",
                    started=1.7e9, outcome="passed", ended=1.7e9 + 2)  # fmt: skip
    record.param(recipe="amp-fp16", model="mlp", size="small", seed="0", device="cpu")
    record.metric(**{f"metric_{i}": 0.125 * i for i in range(12)})
    record.history(loss=[2.0 / (step + 1) for step in range(18)])
    for claim in claims:
        record.verdicts[claim] = Verdict(
            claim, "VERDICT", "scale 65536 -> 32768 after an injected inf at step 3; the step "
            "was skipped and the weights kept their values (max |dw| 0, 3 of 3 seeds)",
        )  # fmt: skip
    line = json.dumps({"type": "record", "session_id": "SID", "record": record.to_dict()})
    line = line.replace("{", "{{").replace("}", "}}")
    for name in ("SID", "RID", "TEST", "VERDICT"):
        line = line.replace(name, "{" + name.lower() + "}")
    return line + "\n"


def write_history(path: Path, entries: int) -> int:
    """Append sessions of TESTS records to the journal at `path` until it holds `entries`
    entries (the last session may be cut short and left without an end, as a killed one is);
    returns the number of sessions."""
    claims = list(catalogue())
    templates = [_record_template([claims[i % len(claims)]]) for i in range(TESTS)]
    written = sessions = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < entries:
            sid = f"{sessions:032x}"
            session = {"type": "session", "session_id": sid, "name": f"ci run {sessions}",
                       "started": 1.7e9 + sessions * 3600, "args": ["scenarios"],
                       "fingerprint": CPU}  # fmt: skip
            f.write(json.dumps(session) + "\n")
            written += 1
            for index, template in enumerate(templates[: entries - written]):
                verdict = ("confirmed", "refuted", "partly")[(sessions + index) % 3]
                f.write(template.format(sid=sid, rid=f"{sid}{index:04d}", verdict=verdict,
                                        test=f"scenarios/test_ci.py::test_{index}"))  # fmt: skip
                written += 1
            if written < entries:
                end = {"type": "session_end", "session_id": sid, "ended": 1.7e9 + sessions * 3600
                       + 60, "exitstatus": 0, "counts": {"passed": TESTS}}  # fmt: skip
                f.write(json.dumps(end) + "\n")
                written += 1
            sessions += 1
    return sessions
