"""`batchd serve MANIFEST.yaml`: one replica, locally or in a pod, from a BatchedDeployment manifest.

The same manifest a user would `kubectl apply` runs on a laptop; in a pod the operator mounts it
at /etc/batchd/manifest.yaml. Bad manifests and settings exit with status 2 and a message that
names the field; a model that fails to load exits non-zero, and its reason goes to the pod's
termination log so that `kubectl describe pod` shows it.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import uvicorn

from batchd.api.httpserver import UVICORN_OPTIONS
from batchd.api.manifest import ManifestError, load_manifest
from batchd.api.spec import BatchedDeployment
from batchd.api.tracing_config import TracingConfig, environment
from batchd.replica.front.app import create_app
from batchd.replica.front.server import ReplicaServer, replica_protocol
from batchd.replica.settings import ReplicaSettings, check_call_url

if TYPE_CHECKING:  # imported only when tracing is configured: OpenTelemetry is loaded with it
    from batchd.replica.tracing import ReplicaTracing

TERMINATION_LOG = Path("/dev/termination-log")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="batchd", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve one replica of a BatchedDeployment manifest")
    serve.add_argument("manifest", type=Path, help="a YAML file holding a BatchedDeployment")
    serve.add_argument("--host", default=None, help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port to listen on (default 8000)")
    serve.add_argument("--log-level", default=None, choices=["debug", "info", "warning", "error"])
    serve.add_argument(
        "--access-log",
        action="store_true",
        help="log every request (costs throughput: predictions then take the ASGI path, not the direct one)",
    )
    serve.add_argument(
        "--app-dir", type=Path, default=Path("."), help="where handler modules are imported from (default: .)"
    )
    serve.add_argument(
        "--api-keys",
        type=Path,
        default=None,
        metavar="FILE",
        help="for a deployment with spec.access served with no router: the Secrets its tenants name, "
        "as YAML; a caller presents one of their keys (Authorization: Bearer, or x-api-key); "
        "overrides BATCHD_API_KEYS_FILE",
    )
    serve.add_argument(
        "--call",
        action="append",
        default=[],
        metavar="ALIAS=URL",
        help="where an alias of model.calls is served, e.g. embedder=http://127.0.0.1:8001 "
        "(repeatable; adds to BATCHD_CALLS)",
    )
    return parser.parse_args(argv)


def parse_calls(flags: list[str]) -> dict[str, str]:
    """`--call alias=URL` flags as a mapping; ValueError naming the flag when one is malformed."""
    calls: dict[str, str] = {}
    for flag in flags:
        alias, equals, url = flag.partition("=")
        if not equals or not alias:
            raise ValueError(f"--call {flag!r}: expected ALIAS=URL, e.g. embedder=http://127.0.0.1:8001")
        try:
            check_call_url(alias, url)
        except ValueError as error:
            raise ValueError(f"--call {error}") from None
        calls[alias] = url.rstrip("/")
    return calls


def serve(args: argparse.Namespace) -> int:
    # Like uvicorn's --app-dir: `model.handler: examples.adder:...` imports relative to it.
    sys.path.insert(0, str(args.app_dir.resolve()))
    try:
        manifest = load_manifest(args.manifest)
        settings = ReplicaSettings.from_env(
            host=args.host, port=args.port, log_level=args.log_level, api_keys_file=args.api_keys
        )
        if settings.api_keys_file is not None and manifest.spec.access is None:
            # Keys for a deployment that takes everyone would be a control that controls nothing.
            raise ValueError(
                f"--api-keys {settings.api_keys_file}: deployment {manifest.metadata.name!r} has no "
                "spec.access, so it serves every caller as `anonymous`; declare its tenants"
            )
        if args.call:
            settings = settings.model_copy(update={"calls": {**settings.calls, **parse_calls(args.call)}})
    except (ManifestError, ValueError) as error:
        print(f"batchd: {error}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    tracing = start_tracing(manifest)
    app = create_app(manifest, settings, manifest_path=args.manifest, tracing=tracing)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        lifespan="on",
        log_level=settings.log_level,
        access_log=args.access_log,
        timeout_graceful_shutdown=math.ceil(settings.drain_timeout_s),
        **{**UVICORN_OPTIONS, "http": replica_protocol(app, access_log=args.access_log)},
    )
    sockets = [config.bind_socket()]
    if settings.metrics_port:  # /metrics on a port of its own, served by the same server
        metrics = uvicorn.Config(app, host=settings.host, port=settings.metrics_port, **UVICORN_OPTIONS)
        sockets.append(metrics.bind_socket())
    server = ReplicaServer(config, app.replica, settings.drain_timeout_s)
    try:
        server.run(sockets=sockets)
    finally:
        if tracing is not None:
            tracing.shutdown()  # what is still buffered goes out before the process exits
    if app.replica.hung:
        # Its thread cannot be stopped, and the interpreter would wait for it at exit.
        logging.shutdown()
        os._exit(1)
    load_error = app.replica.load_error
    if load_error is not None or not server.started:
        _write_termination_log(f"model {manifest.model_name!r} failed to load: {load_error}")
        return 3
    return 0


def start_tracing(manifest: BatchedDeployment) -> ReplicaTracing | None:
    """The replica's tracing, where the environment configures it: in a pod the operator rendered
    `spec.tracing` into it; locally a manifest's `spec.tracing` fills in what the environment does
    not say, as the operator would. None (and no OpenTelemetry import) when tracing is off."""
    if manifest.spec.tracing is not None:
        for name, value in environment(manifest.spec.tracing, manifest.metadata.name).items():
            os.environ.setdefault(name, value)
    config = TracingConfig.from_environ(os.environ)
    if config is None:
        return None
    from opentelemetry import trace

    from batchd.api.tracing import pipeline
    from batchd.replica.tracing import ReplicaTracing

    spans = pipeline(manifest.metadata.name)
    trace.set_tracer_provider(spans.provider)  # a handler's own spans go where the replica's go
    return ReplicaTracing(spans, manifest, config)


def _write_termination_log(message: str) -> None:
    with contextlib.suppress(OSError):  # not in a pod
        TERMINATION_LOG.write_text(message)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return serve(args)
    except KeyboardInterrupt:  # Ctrl-C, re-raised by uvicorn after a graceful stop
        return 130


if __name__ == "__main__":
    sys.exit(main())
