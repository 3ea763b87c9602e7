"""amp-harness: every claim of an AMP article as an executable scenario, verdicts in MLflow."""

__version__ = "0.1.0"
