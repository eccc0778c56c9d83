"""`python -m batchd.bench` (`make bench`): the main scenarios (`batchd.bench.scenarios`)."""

import sys

from batchd.bench.scenarios.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
