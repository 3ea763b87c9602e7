"""`python -m harness.cli ARGS`: `amp-harness ARGS` where it is not installed as a command."""

import sys

from harness.cli import main

sys.exit(main())
