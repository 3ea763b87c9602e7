"""Reading records back. Imports every layer below it: common, catalogue, lab, records.

- `ledger`: the report's model (claims x environments, the sessions marked experimental apart,
  the history's input), read from MLflow by `ledger_read`, built from its runs by
  `ledger_sessions` (when a session is complete or experimental), `ledger_columns` (the columns
  and cells) and `ledger_history` (each class's history); `report` (+ `templates/`): its
  rendering, the HTML and Markdown report and the figures;
- `baseline`: the baseline file, its one owner (written, read and checked against its format,
  `baseline_format`: its one schema, each field typed, the verdict words closed), and the run a
  command line names;
- `compare` (two runs matched), `comparison` (what it comes to), `attribution` (why each change
  may have happened), `significance` (Welch's t-test on a metric's repetitions),
  `comparison_view` (on the terminal); `differences`, `changes`: sessions and releases side by
  side;
- `table`: the verdict table at the end of a session; `diagnoses`: the saved diagnoses;
- `atlas`: the autocast atlas as a table, and its changes across releases;
- the upgrade gate: `kinds` (what kind a difference is), `nearest` (the baseline a release
  without its own is gated against), `accepted` (the reviewed accepted-changes file),
  `upgrade` (`amp-harness upgrade`: an upgrade's changes per class);
- `known_bugs`: the known bugs' verdicts read back per environment (the last session, the
  baselines), an upgrade's fixes, introductions and keeps, the report's table;
- `history` (each claim's verdicts and key metrics over the sessions, per class) and `ranges`
  (`compare --range`: what changed at which session); `sessions`: the journal's sessions.
"""
