"""The replica: a FastAPI server that gathers independent requests into batches for one model."""
