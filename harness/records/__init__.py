"""What was observed, and where it is kept. Imports harness.common, catalogue and lab.

- `record`: one test's result; `shapes`: the JSON it is read back from;
- `journal` (+ `journal_index`): the append-only file every result reaches first;
- `tracking`: MLflow, second (+ `halfmade`: a store whose first opening was stopped);
- `fingerprint`, `environments`: what the environment was;
- `isolation`, `stopsignals`, `warned`: a scenario run so that no result is lost.
"""
