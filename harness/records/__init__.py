"""What was observed, and where it is kept. Imports harness.common, catalogue and lab.

- `record`: one test's result; `shapes`: the JSON it is read back from;
- `journal` (+ `journal_index`): the append-only file every result reaches first;
- `tracking`: MLflow, second: the face of `mlflow/`, its plumbing a module a concern (URIs,
  bounds, locks, naming, the sink) (+ `halfmade`: a store whose first opening was stopped);
- `fingerprint`, `environments`: what the environment was;
- `isolation`, `stopsignals`, `warned`: a scenario run so that no result is lost;
- `torch_state`: the global torch state a scenario must leave as it found it;
- `options`: the options the CLI and the plugin share, defined once.
"""
