"""The BatchedDeployment spec: the one definition the operator, the replica and the CRD share.

This package imports without torch, FastAPI or Kopf: both images install it.
"""

from importlib.metadata import version

# Every batchd project takes its version from the repository's VERSION file at build time.
__version__ = version("batchd-api")
