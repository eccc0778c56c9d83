"""`batchd-router` (and `python -m batchd.router`): run the router with uvicorn.

Settings come from `BATCHD_*` variables; `--host`, `--port` and `--log-level` override them. A
bad value stops the router at startup with the variable and the value (exit status 2).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import TYPE_CHECKING

import uvicorn

from batchd.api.environment import SettingsError
from batchd.api.httpserver import UVICORN_OPTIONS
from batchd.api.tracing_config import TracingConfig
from batchd.router.app import create_app
from batchd.router.server import FINISH_S, RouterServer
from batchd.router.settings import RouterSettings

if TYPE_CHECKING:  # imported only when tracing is configured: OpenTelemetry is loaded with it
    from batchd.router.tracing import RouterTracing

SERVICE_NAME = "batchd-router"  # where the environment names none


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="batchd-router", description=__doc__.splitlines()[0])
    parser.add_argument("--host", help="address to listen on (BATCHD_HOST; default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (BATCHD_PORT; default 8080)")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--access-log", action="store_true", help="log every request (off: it costs)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        settings = RouterSettings.from_env(host=args.host, port=args.port, log_level=args.log_level)
    except SettingsError as error:
        print(f"batchd-router: {error}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    tracing = start_tracing()
    app = create_app(settings, tracing=tracing)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=args.access_log,
        timeout_graceful_shutdown=FINISH_S,
        lifespan="on",  # the watches start in the lifespan: no lifespan, no routing
        **UVICORN_OPTIONS,
    )
    # One server, two listeners: the clients' port and the admin port (`/metrics`, `/held`). The
    # application tells them apart by the port a request came in on.
    admin_config = uvicorn.Config(app, host=settings.host, port=settings.admin_port, **UVICORN_OPTIONS)
    sockets = [config.bind_socket(), admin_config.bind_socket()]
    app.admin_port = sockets[1].getsockname()[1]
    server = RouterServer(config, app.proxy, settings.drain_timeout_s)
    try:
        server.run(sockets=sockets)
    except KeyboardInterrupt:
        return 130
    finally:
        if tracing is not None:
            tracing.shutdown()  # what is still buffered goes out before the process exits
    return 0 if server.started else 3


def start_tracing() -> RouterTracing | None:
    """The router's tracing, where the standard OpenTelemetry environment configures it (the
    chart's `tracing` values); None, and no OpenTelemetry import, when it does not."""
    config = TracingConfig.from_environ(os.environ)
    if config is None:
        return None
    from batchd.api.tracing import pipeline
    from batchd.router.tracing import RouterTracing

    return RouterTracing(pipeline(SERVICE_NAME), config.sampler)


if __name__ == "__main__":
    sys.exit(main())
