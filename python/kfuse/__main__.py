"""`python -m kfuse ARGS` runs the CLI, like the `kfuse` console script."""

import sys

from ._cli import main

sys.exit(main())
