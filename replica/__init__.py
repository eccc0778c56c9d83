"""The replica: a FastAPI server that gathers independent requests into batches for one model."""

__version__ = "0.1.0"
