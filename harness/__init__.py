"""amp-harness: every claim of an AMP article as an executable scenario, verdicts in MLflow.

Its floors (docs/architecture.md), each a package: `common` (text and errors, for all),
`catalogue` (what is claimed, and what a verdict is worth) and `lab` (how AMP behaviour is
measured) side by side, `records` (what was observed, and where it is kept), `reports` (reading
records back), and the faces on top: `plugin` (pytest's) and `cli` (`amp-harness`).

PYTEST_DONT_REWRITE: `amp-harness run` imports this package before it starts pytest in the same
process, and pytest asks to rewrite the asserts of an installed plugin's package; already
imported, it cannot, and its warning is an error under this project's warning filters. The
package's own checks raise HarnessError, not assert, so there is nothing to rewrite.
"""

__version__ = "0.1.0"
