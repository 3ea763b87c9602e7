"""MLflow's plumbing, a module a concern; `harness.records.tracking` is its face, which the rest
of the harness imports. (Absolute imports only: inside this package, `mlflow` is still MLflow.)

- `uris`: where the store is (the tracking URI, the embedded store), passwords taken out
  (`redact`), the `amp-harness` command lines printed, the UI's links and saved views;
- `bounds`: how long MLflow is waited for (Bounds, SESSION, COMMAND), MLflow's sender held to
  them, the bounded client every reader and writer uses, and its failures said (Unavailable,
  `reason`);
- `locks`: the file locks beside a store and its journal (a new store's opening, one `sync` at a
  time, a session that still runs);
- `naming`: what a run is called and holds (its name, description, tags) and the points of a
  long history MLflow gets;
- `sink`: MlflowSink, a session logged live: one parent run per session and one child run per
  test, MLflow off for the rest of the session at its first failure;
- `replay`: `sync`, the journal replayed into MLflow through a sink: what it lacks sent, half-made
  runs logged afresh, the runs of killed sessions ended;
- `runs`: the runs MLflow holds, read back: searched page by page, a session's main parent run,
  whether a test's run is complete, the copies a retried request made deleted;
- `rows`: complete runs written into an SQL store in one transaction, MLflow's own tables and
  checks, past its client's four calls a run (the sink's way on the embedded store);
- `writer`: Writer, a session's sink in a process of its own: the tests never wait for MLflow
  nor share their interpreter with it; at the session's end it is waited for within a bound,
  and what it did not send is said;
- `writer_process`: that process: the session's items read from stdin, logged in batches, what
  the session's end says written back;
- `sqlite_store`: the embedded store where the harness reaches past MLflow: writable or not,
  `sync`'s commits without fsync, its artifact paths following a moved store;
- `empty_store`: a new embedded store, a copy of an empty one MLflow made once per release.
"""
