"""`create_app`: the router's ASGI application, with a lifespan that opens and closes what it uses.

At startup: the connection pool to the replicas, the API client, one LIST+WATCH per kind and
namespace, and the background `GET /load` poller. The router answers from the start (health,
metrics) and routes once every watch has listed what exists (`/readyz`). At shutdown every
background task is cancelled and awaited, then the pools close.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from dataclasses import dataclass, field

import aiohttp

from batchd.router.access import Keyring
from batchd.router.client_request import Message, Receive, Send
from batchd.router.connections import Pool
from batchd.router.directory import DeploymentRef, Directory
from batchd.router.holding import Holds
from batchd.router.kube_client import KubeClient
from batchd.router.loads import LoadPoller, Loads
from batchd.router.metrics import RouterMetrics
from batchd.router.peers import Peers, watched_peers
from batchd.router.prefixes import PrefixIndex
from batchd.router.proxy import Proxy
from batchd.router.quotas import Quotas
from batchd.router.settings import RouterSettings
from batchd.router.token_reviews import TokenReviews, kube_reviewer
from batchd.router.traces import Tracing
from batchd.router.upstream import Upstream
from batchd.router.watching import Watcher, watched_kinds

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class DirectoryEvents:
    """What the directory's changes mean for held requests, idle connections and the metrics."""

    holds: Holds
    metrics: RouterMetrics
    pool: Pool
    prefixes: PrefixIndex
    known: dict[DeploymentRef, tuple[str, ...]] = field(default_factory=dict)

    def replicas_changed(self, ref: DeploymentRef, replicas: tuple[str, ...]) -> None:
        self.metrics.replicas.labels(ref.namespace, ref.name).set(len(replicas))
        for gone in set(self.known.get(ref, ())) - set(replicas):
            self.pool.forget(gone)
            self.prefixes.forget(gone)  # a replica that comes back at that address starts empty
        self.known[ref] = replicas
        if replicas:
            self.holds.release(ref)

    def deployment_deleted(self, ref: DeploymentRef, model: str) -> None:
        self.holds.fail(ref, model)
        with contextlib.suppress(KeyError):
            self.metrics.replicas.remove(ref.namespace, ref.name)


@dataclass
class RouterApp:
    """The router as uvicorn runs it: its parts, built once, and the lifespan that starts and stops
    what runs beside requests (the watches, the load poller); requests go to `Proxy`."""

    settings: RouterSettings
    metrics: RouterMetrics = field(default_factory=RouterMetrics)
    rng: random.Random = field(default_factory=random.Random)
    tracing: Tracing | None = None  # None: untraced

    def __post_init__(self) -> None:
        settings = self.settings
        self.holds = Holds(settings.max_held_per_deployment, self.metrics)
        self.upstream = Upstream(settings)
        self.prefixes = PrefixIndex(settings.prefix_chunks_per_replica)
        events = DirectoryEvents(self.holds, self.metrics, self.upstream.pool, self.prefixes)
        self.directory = Directory(events)
        self.loads = Loads()
        self.keyring = Keyring()
        self.peers = Peers()
        self.watchers: list[Watcher] = []
        self.proxy = Proxy(
            settings,
            self.directory,
            self.holds,
            self.loads,
            self.upstream,
            self.metrics,
            self.synced,
            self.rng,
            self.prefixes,
            self.tracing,
            self.keyring,
            quotas=Quotas(self.peers.count),
        )
        # The port whose requests are the admin's (`/metrics`, `/held`); `cli` sets the one it bound
        # where settings ask for any free one (0).
        self.admin_port = settings.admin_port
        self._tasks: list[asyncio.Task[None]] = []
        self._api: KubeClient | None = None
        self._session: aiohttp.ClientSession | None = None

    def synced(self) -> bool:
        return bool(self.watchers) and all(watcher.synced.is_set() for watcher in self.watchers)

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            server = scope.get("server")
            if server is not None and server[1] == self.admin_port:
                await self.proxy.admin(scope, send)
            else:
                await self.proxy(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.start()
                except Exception as error:
                    logger.exception("the router could not start")
                    await send({"type": "lifespan.startup.failed", "message": str(error)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def start(self) -> None:
        settings = self.settings
        # The load readings are few and off the request path: aiohttp's client is convenient there.
        self._session = session = aiohttp.ClientSession()
        self._api = await KubeClient.connect(settings.kubeconfig)
        self.proxy.reviews = TokenReviews(kube_reviewer(self._api))
        namespaces: tuple[str | None, ...] = settings.namespaces or (None,)
        self.watchers = [
            Watcher(
                self._api,
                watched,
                namespace,
                timeout_s=settings.watch_timeout_s,
                retry_s=settings.watch_retry_s,
            )
            for watched in watched_kinds(self.directory, self.keyring)
            for namespace in namespaces
        ]
        if settings.router_service and settings.router_namespace:
            peers = watched_peers(self.peers, settings.router_service)
            self.watchers.append(
                Watcher(
                    self._api,
                    peers,
                    settings.router_namespace,
                    timeout_s=settings.watch_timeout_s,
                    retry_s=settings.watch_retry_s,
                )
            )
        poller = LoadPoller(
            self.loads,
            self.directory.all_replicas,
            session,
            self.metrics,
            interval_s=settings.load_poll_interval_s,
            timeout_s=settings.load_poll_timeout_s,
        )
        self._tasks = [
            *(asyncio.create_task(watcher.run(), name=f"watch-{watcher.path}") for watcher in self.watchers),
            asyncio.create_task(poller.run(), name="poll-replica-load"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._api is not None:
            await self._api.close()
        if self._session is not None:
            await self._session.close()
        self.upstream.close()


def create_app(
    settings: RouterSettings, metrics: RouterMetrics | None = None, tracing: Tracing | None = None
) -> RouterApp:
    return RouterApp(settings, metrics or RouterMetrics(), tracing=tracing)
