"""Deprecated: the example factories moved to harness.lab.diagnose.examples (diagnose became a
package, docs/architecture.md). `amp-harness diagnose harness.lab.diagnose_examples:mlp` keeps
working, with a DeprecationWarning, until the release after next."""

import warnings

from harness.lab.diagnose.examples import cnn, fragile, mlp, transformer  # noqa: F401

warnings.warn(
    "harness.lab.diagnose_examples moved to harness.lab.diagnose.examples: name the factory "
    "as harness.lab.diagnose.examples:NAME",
    DeprecationWarning,
    stacklevel=2,
)
