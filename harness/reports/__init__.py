"""Reading records back. Imports every layer below it: common, catalogue, lab, records.

- `report` (+ `templates/`): the HTML and Markdown report, from MLflow;
- `compare`, `baseline`, `differences`, `changes`: sessions and releases side by side;
- `table`: the verdict table at the end of a session; `diagnoses`: the saved diagnoses;
- `atlas`: the autocast atlas as a table, and its changes across releases.
"""
