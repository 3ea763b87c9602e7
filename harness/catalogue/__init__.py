"""What is claimed, and what a verdict on a claim is worth. Imports only harness.common.

- `claims`: the catalogues (the article's `claims.json`, the built-in `claims_*.toml`, a
  project's `scenarios/claims.toml`) and the verdicts a claim may get;
- `contract`: the scenario contract `amp-harness validate` checks, and `new`'s template;
- `controls`: negative controls, read from a scenario's source;
- `verdicts`: how one claim's verdicts across tests and sessions make one verdict.
"""
