"""Faults put into the MLflow writer's own process (harness/records/mlflow/writer_process.py),
which a test's monkeypatch cannot reach: on PYTHONPATH (tests/helpers/writer.py's `in_the_writer`),
Python imports this module as every process starts; it acts in the writer's alone, as the
environment variables set by the test ask:

- AMP_TEST_WRITER_CALLS=FILE: each connection opened to a server and each time the sink turns
  off, appended to FILE as JSON lines (helpers.tracked.counting_mlflow_calls reads them);
- AMP_TEST_WRITER_HOLD=FOLDER: each batch held until FOLDER/release exists; FOLDER/inside made as
  the first is held (a server as slow as a test wants);
- AMP_TEST_WRITER_STORE=full: the store cannot be opened, the disk full;
- AMP_TEST_WRITER_MLFLOW=missing: mlflow cannot be imported (an incomplete install);
- AMP_TEST_WRITER_KILL=NAME: the writer killed (SIGKILL) as it writes the files of the test
  whose name ends with NAME;
- AMP_TEST_WRITER_PID=FILE: the writer's process id appended to FILE.
"""

import os
import sys

if any(a.endswith("writer_process") for a in getattr(sys, "orig_argv", [])):
    import signal
    from pathlib import Path

    from harness.records.mlflow import bounds, sink

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for helpers

    calls = os.environ.get("AMP_TEST_WRITER_CALLS")
    if calls:  # counted as helpers.tracked counts the tests' own process
        import urllib3.util.connection
        from helpers.tracked import WrittenCalls

        connect, stop = WrittenCalls(Path(calls)).counting(
            urllib3.util.connection.create_connection, sink.MlflowSink._stop
        )
        urllib3.util.connection.create_connection = connect
        sink.MlflowSink._stop = stop

    hold = os.environ.get("AMP_TEST_WRITER_HOLD")
    if hold:
        from helpers.writer import held_until_released

        sink.MlflowSink.log_records = held_until_released(sink.MlflowSink.log_records, Path(hold))

    if os.environ.get("AMP_TEST_WRITER_MLFLOW") == "missing":
        sys.modules["mlflow"] = None  # `from mlflow import ...` raises ImportError

    if os.environ.get("AMP_TEST_WRITER_STORE") == "full":
        import sqlite3

        def full(uri, set_aside=None):
            raise sqlite3.OperationalError("database or disk is full")

        bounds.client = full

    if os.environ.get("AMP_TEST_WRITER_PID"):
        with open(os.environ["AMP_TEST_WRITER_PID"], "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()}\n")

    kill = os.environ.get("AMP_TEST_WRITER_KILL")
    if kill:
        real_stage = sink.MlflowSink._stage_files

        def killing(record, folder):
            if record.test.endswith(kill):
                os.kill(os.getpid(), signal.SIGKILL)
            return real_stage(record, folder)

        sink.MlflowSink._stage_files = staticmethod(killing)
