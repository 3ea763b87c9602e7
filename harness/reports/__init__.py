"""Reading records back. Imports every layer below it: common, catalogue, lab, records.

- `ledger`: the report's model, read from MLflow (claims x environments, the sessions marked
  experimental apart, the history's input); `report` (+ `templates/`): its rendering, the HTML
  and Markdown report and the figures;
- `baseline`: the baseline file, its one owner (written, read and checked against its format);
- `compare`, `differences`, `changes`: sessions and releases side by side;
- `table`: the verdict table at the end of a session; `diagnoses`: the saved diagnoses;
- `atlas`: the autocast atlas as a table, and its changes across releases;
- the upgrade gate: `kinds` (what kind a difference is), `nearest` (the baseline a release
  without its own is gated against), `accepted` (the reviewed accepted-changes file),
  `upgrade` (`amp-harness upgrade`: an upgrade's changes per class);
- `history` (each claim's verdicts and key metrics over the sessions, per class) and `ranges`
  (`compare --range`: what changed at which session); `sessions`: the journal's sessions.
"""
