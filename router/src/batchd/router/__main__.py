"""`python -m batchd.router`: the same as the `batchd-router` command."""

import sys

from batchd.router.cli import main

sys.exit(main())
