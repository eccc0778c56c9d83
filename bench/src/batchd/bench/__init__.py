"""batchd's demo and benchmarks (dev only; never in an image)."""

from batchd.testing import ROOT

# Every benchmark writes its figures here, in the checkout: they are committed with the README.
RESULTS_DIR = ROOT / "bench" / "results"
