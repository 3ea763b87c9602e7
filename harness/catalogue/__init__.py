"""What is claimed, and what a verdict on a claim is worth. Imports only harness.common.

- `claims`: the catalogues (the article's `claims.json`, the built-in `claims_*.toml`, the
  known bugs, a project's `scenarios/claims.toml`) and the verdicts a claim may get;
- `files`: what every catalogue file shares (its TOML tables, the IDs `GROUP-NAME`, the error);
- `known_bugs`: the known-bug ledger (`known_bugs.toml`, a project's own beside its claims):
  each upstream bug, the releases it affects, its words for a verdict;
- `collected_claims`: the claim markers only pytest can read, by collecting a scenario module;
- `contract`: the scenario contract `amp-harness validate` checks;
- `controls`: negative controls, read from a scenario's source;
- `scenario_source`: a scenario file read with `ast`: its tests, their claims, helpers and verdicts;
- `template`: `amp-harness new`, a scenario written from templates/scenario.py.tmpl;
- `verdicts`: how one claim's verdicts across tests and sessions make one verdict.
"""
