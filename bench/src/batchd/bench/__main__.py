"""`python -m batchd.bench` (`make bench`): the main scenarios (`batchd.bench.scenarios`)."""

import sys

from batchd.bench.kit.command import main
from batchd.bench.scenarios.__main__ import BENCHMARK

if __name__ == "__main__":
    sys.exit(main(BENCHMARK))
