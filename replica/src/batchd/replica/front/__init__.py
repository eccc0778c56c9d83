"""The replica's HTTP front: the routes of every protocol (`protocols`), the ASGI app (`app`), the
direct path answered inside uvicorn's protocol (`direct`), and the server that drains on SIGTERM
(`server`). It calls the core (`batchd.replica.replica`, `batching`, `models`), never the reverse."""
