"""BatchedDeployment manifests for tests, written the one way the benchmarks write them too."""

from batchd.bench.kit.manifests import ADDER, manifest

__all__ = ["ADDER", "manifest"]
