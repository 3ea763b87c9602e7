"""What the tests share, imported as `helpers.<module>` (tests/ is on sys.path: tests/conftest.py
sits there, in pytest's prepend import mode). Not test modules themselves:

- `autocast_breaks`: one op's autocast rule broken at the dispatcher, as a release dropping it;
- `browser`: headless Chromium (where it is, `amp-harness ui` started and stopped, MLflow's pages);
- `journals`: a journal of a year of CI history, written cheaply, for the scale benchmarks;
- `rank_faults`: faults installed inside spawned distributed ranks (AMP_HARNESS_RANK_SETUP);
- `servers`: real servers on loopback (`mlflow server`, a throwaway PostgreSQL, faulty proxies);
- `sessions`: MLflow stores holding sessions and test runs logged through MlflowSink;
- `slow_left_out`: a pytest plugin: the quick tier says what it left out, and the command for it;
- `team_guide`: the files of docs/writing-a-scenario.md's team example, read from the guide;
- `tracked`: sessions, journals and stores the tracking tests share, and their checks;
- `writer`: faults put into the MLflow writer's own process (writer_hooks/sitecustomize.py);
- `xdist_groups`: a pytest plugin: --dist loadgroup keeps each xdist_group on one worker;
- `zoo`: models nobody here wrote, and engineered failures, for diagnose's truth benchmark;
- `zoo_truth`: what plain training does under each recipe, the truth diagnose is judged by;
- `zoo_growth`: models whose fp16 hazard grows with training, for diagnose's forecast;
- `zoo_edges`: models at the edges of what diagnose says (a contrastive loss, a patch RMSNorm);
- `zoo_half_adamw`: small NeoX, Phi and DeBERTa for a half model's AdamW with eps 1e-4.

The two plugins' own tests sit beside them (test_slow_left_out.py, test_xdist_groups.py).
"""
