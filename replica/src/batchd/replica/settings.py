"""How this process runs, as opposed to what it serves (that is the manifest's spec).

Read once at start-up from flags and `BATCHD_*` variables, then passed down; nothing below
reads the environment again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, field_validator
from pydantic_settings import NoDecode

from batchd.api.access import read_key_secrets
from batchd.api.environment import EnvironmentSettings, LogLevel
from batchd.api.pod import REPLICA_PORT


class ReplicaSettings(EnvironmentSettings):
    host: str = "127.0.0.1"
    port: int = Field(default=REPLICA_PORT, ge=0, le=65535)
    # The port /metrics is served on, alone (the operator sets 9090: a NetworkPolicy lets the
    # scraper reach it and no caller); 0: /metrics beside inference (a replica run by hand).
    metrics_port: int = Field(default=0, ge=0, le=65535)
    # The deployment's signing key (the operator mounts it from `<name>-access`): what the router
    # signs its stamps with (`batchd.api.stamp`). None: no stamp can be checked, so a deployment
    # with `spec.access` refuses every inference request (`front.gate`).
    signing_key_file: Path | None = None
    # API keys the replica takes itself, for a deployment with `spec.access` served with no router
    # (`batchd serve --api-keys`): a file of the Secrets its tenants name (`read_key_secrets`).
    api_keys_file: Path | None = None
    # Where `hf://org/name` sources resolve for clusters with no internet: <mirror>/org/name.
    model_mirror: Path | None = None
    # Where the operator mounts PVCs: `pvc://claim/path` -> <pvc_root>/claim/path.
    pvc_root: Path = Path("/models")
    # Bodies above this are refused with 413 before they are parsed (bytes).
    max_body_bytes: PositiveInt = 16 * 1024 * 1024
    # On SIGTERM: how long accepted requests get to finish before the process exits anyway (seconds).
    # The pod's terminationGracePeriodSeconds must be longer.
    drain_timeout_s: PositiveFloat = 60.0
    # A keep-alive connection ends after this many requests or this age (seconds, jittered by a
    # tenth per connection); 0 = no bound. The answer past the bound says `Connection: close` and
    # the connection closes once it is complete, so clients that bypass the router (kube-proxy
    # balances connections, not requests) spread over a scaled-up deployment within
    # `keepalive_max_age_s`. 5 s keeps that within the time a new replica takes to be counted
    # ready; one new connection per client connection every 5 s (a TCP handshake on loopback or a
    # pod network, ~0.1 ms) or every 1000 requests (nginx's `keepalive_requests` default) costs
    # no measurable throughput.
    keepalive_max_requests: NonNegativeInt = 1000
    keepalive_max_age_s: NonNegativeFloat = 5.0
    log_level: LogLevel = "info"
    # How often the mounted manifest is read for live retuning (seconds); a stat and a small read.
    config_poll_s: PositiveFloat = 1.0
    # Where each alias of `model.calls` is reached, alias -> base URL (JSON in BATCHD_CALLS): the
    # operator passes the callees' Service URLs; locally `batchd serve --call alias=URL` adds to it.
    calls: Annotated[dict[str, str], NoDecode] = Field(default_factory=dict)

    @field_validator("calls", mode="before")
    @classmethod
    def _json(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return json.loads(value) if value.strip() else {}
        except json.JSONDecodeError:
            raise ValueError('expected JSON such as {"embedder": "http://127.0.0.1:8001"}') from None

    @field_validator("signing_key_file")
    @classmethod
    def _readable_key(cls, path: Path | None) -> Path | None:
        if path is not None:
            try:
                key = path.read_bytes()
            except OSError as error:
                raise ValueError(f"cannot read the signing key: {error.strerror}") from None
            if not key:
                raise ValueError("the signing key file is empty")
        return path

    @field_validator("calls")
    @classmethod
    def _http_urls(cls, calls: dict[str, str]) -> dict[str, str]:
        for alias, url in calls.items():
            check_call_url(alias, url)
        return {alias: url.rstrip("/") for alias, url in calls.items()}

    @field_validator("api_keys_file")
    @classmethod
    def _readable_keys(cls, path: Path | None) -> Path | None:
        if path is not None:
            read_key_secrets(path)  # ValueError naming what is wrong
        return path

    @field_validator("model_mirror", "signing_key_file", "api_keys_file", mode="before")
    @classmethod
    def _unset_when_empty(cls, value: Any) -> Any:
        return None if value == "" else value


def check_call_url(alias: str, url: str) -> None:
    """A callee's address must be a base URL the handle appends the protocol's paths to:
    http(s)://host[:port], or with a path prefix such as a router's /deployments/NAMESPACE/NAME;
    never a URL that already holds a protocol path (`/v1/...`, `/v2/...`), a query or a fragment."""
    parsed = urlsplit(url)
    segments = parsed.path.strip("/").split("/")
    if (
        parsed.scheme not in ("http", "https")
        or not parsed.hostname
        or parsed.query
        or parsed.fragment
        or "v1" in segments
        or "v2" in segments
    ):
        raise ValueError(
            f"{alias}: expected a base URL such as http://127.0.0.1:8001 or a router's "
            f"http://ROUTER/deployments/NAMESPACE/NAME, got {url!r}"
        )
