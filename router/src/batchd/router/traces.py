"""What the request path tells of a request's way through the router, for tracing: the seam that
the router's tracing module (`batchd.router.tracing`, the one module that imports OpenTelemetry)
fills. With tracing off no request carries a trace, and no OpenTelemetry code is loaded."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class RouteTrace(Protocol):
    """One request's trace at the router: its SERVER span where it is recorded."""

    def routed(self, namespace: str, name: str, model: str) -> None:
        """It goes to this deployment, for this model."""
        ...

    def held(self, seconds: float) -> None:
        """It was held `seconds` while its deployment had no ready replica."""
        ...

    def revision(self, canary: bool) -> None:
        """A canary rollout drew the canary's revision for it, or the stable one."""
        ...

    def picked(self, replica: str, candidates: Sequence[str]) -> None:
        """`replica` was chosen among `candidates` (its revision's ready replicas not tried yet)."""
        ...

    def retried(self, replica: str, reason: str) -> None:
        """`replica` refused it before accepting it, or could not be reached: it goes to another."""
        ...

    def caller_trusted(self, trusted: bool) -> None:
        """Who the caller is is known: whether its tenant's sampled flag may decide the recording
        (`trust_traces`). A request refused before this is taken as untrusted."""
        ...

    def upstream_headers(self) -> bytes:
        """Header lines (`name: value\\r\\n`) carrying this span's context to the replica."""
        ...

    def finished(self, status: int, error: BaseException | None) -> None:
        """It was answered `status` (499: the client left); the span ends."""
        ...


class Tracing(Protocol):
    """The router's tracing: a span per recorded request."""

    @property
    def propagation_headers(self) -> frozenset[bytes]:
        """The headers that carry a caller's context: where a request has a trace, the router sends
        its own in their place."""
        ...

    def request_started(
        self, method: str, route: str, path: str, headers: list[tuple[bytes, bytes]]
    ) -> RouteTrace:
        """The trace of a request to `route` (a path template), continuing the caller's where its
        headers carry one, recorded or not."""
        ...

    def shutdown(self) -> None:
        """Send what is still buffered, and stop."""
        ...
