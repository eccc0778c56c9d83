"""The replica's Prometheus metrics: what the batcher does, seen from outside.

Names are in Prometheus base units with the `batchd_` prefix; every series carries only the
`deployment` and `model` labels (plus `outcome` or `reason` where counting those is the point),
so cardinality stays fixed whatever the traffic. Each app gets its own registry, which keeps
tests and several apps in one process apart.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString

from batchd.replica.errors import ERROR_TABLE
from batchd.replica.queueing import tenant_of

BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
# From sub-millisecond overhead to multi-second generation.
SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

# `invalid`: the caller's malformed request (400, 404); `item_failed`: the model raised on an item
# of it alone (422), which a revision answers for.
OUTCOMES = ("success", "error", "timeout", "rejected", "invalid", "item_failed", "cancelled")
# Every `reason` the error table gives a refusal, each a series from the start.
REJECTION_REASONS = tuple(dict.fromkeys(answer.rejection for _, answer in ERROR_TABLE if answer.rejection))
# Outcomes of reading a changed manifest (live retuning): applied, refused as invalid, or a change
# only a new pod can make (the operator rolls the pods for those).
RELOAD_OUTCOMES = ("applied", "invalid", "needs_restart")


class ReplicaMetrics:
    """Every metric of one replica, bound to its deployment and model labels."""

    def __init__(self, deployment: str, model: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        labels = ("deployment", "model")
        values = (deployment, model)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=self.registry).labels(*values)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=self.registry).labels(*values)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=self.registry).labels(*values)

        self.queue_depth = gauge("batchd_queue_depth", "Items waiting to join a batch.")
        self.running_items = gauge("batchd_running_items", "Items in batches the model is computing now.")
        self.batching_revision = gauge(
            "batchd_batching_revision",
            "Revision of the spec.batching this replica runs (the resource's metadata.generation "
            "when spec.batching last changed).",
        )
        self.inflight = gauge("batchd_inflight_requests", "Requests accepted and not yet answered.")
        self.model_ready = gauge("batchd_model_ready", "1 once the model is loaded and warmed, 0 otherwise.")
        self.batch_size = histogram(
            "batchd_batch_size", "Items per batch sent to the model.", BATCH_SIZE_BUCKETS
        )
        self.batch_wait = histogram(
            "batchd_batch_wait_seconds",
            "From a batch's first item arriving to the batch being sent to the model.",
            SECONDS_BUCKETS,
        )
        self.batch_execution = histogram(
            "batchd_batch_execution_seconds", "Time the model took for one batch.", SECONDS_BUCKETS
        )
        self.batch_failures = counter("batchd_batch_failures_total", "Batches whose model call raised.")
        self.isolation_calls = counter(
            "batchd_isolation_calls",
            "Extra model calls made to find the items that failed a batch (isolate_failures).",
        )
        self.isolated_failures = counter(
            "batchd_isolated_failures",
            "Items that failed alone, found by isolation; their batch-mates were answered.",
        )
        # Adaptive batching (latency_objective_s): what it learned, and what it chose.
        self.batch_cost_fixed = gauge(
            "batchd_batch_cost_fixed_seconds", "Learned cost of a batch, the part any batch pays."
        )
        self.batch_cost_per_item = gauge(
            "batchd_batch_cost_per_item_seconds", "Learned cost of a batch, the part each item adds."
        )
        self.arrival_rate = gauge(
            "batchd_arrival_rate", "Items arriving per second, over the last second or so."
        )
        self.planned_batch_size = gauge(
            "batchd_planned_batch_size", "The batch size adaptive batching last chose to go with or wait for."
        )
        self.objective_items = counter(
            "batchd_objective_items", "Items answered with a latency objective set (latency_objective_s)."
        )
        self.objective_missed = counter(
            "batchd_objective_missed",
            "Of those, the items whose queueing plus model time exceeded the objective.",
        )

        # Counted on every request: plain Python there, Prometheus families when scraped.
        self._answered = AnsweredRequests(self.registry, labels, values)
        reloads = Counter(
            "batchd_config_reloads",
            "Changes of the mounted manifest, by outcome: applied, invalid or needs_restart.",
            (*labels, "outcome"),
            registry=self.registry,
        )
        rejections = Counter(
            "batchd_rejections",
            "Requests refused before queueing, by reason.",
            (*labels, "reason"),
            registry=self.registry,
        )
        # Children are made up front: every series exists (at zero) from the first scrape,
        # so rate() and dashboards work before the first error ever happens.
        self._rejections = {r: rejections.labels(*values, r) for r in REJECTION_REASONS}
        self.classes = ClassFigures(self.registry, labels, values)
        self._reloads = {o: reloads.labels(*values, o) for o in RELOAD_OUTCOMES}

    def track(
        self,
        queue_depth: Callable[[], float],
        running_items: Callable[[], float],
        inflight: Callable[[], float],
    ) -> None:
        """Read the live gauges at scrape time rather than on every request."""
        self.queue_depth.set_function(queue_depth)
        self.running_items.set_function(running_items)
        self.inflight.set_function(inflight)

    def track_adaptive(
        self, cost: Callable[[], tuple[float, float] | None], arrival_rate: Callable[[], float]
    ) -> None:
        """Adaptive batching's learned cost line and arrival rate, read at scrape time."""
        self.batch_cost_fixed.set_function(lambda: (cost() or (0.0, 0.0))[0])
        self.batch_cost_per_item.set_function(lambda: (cost() or (0.0, 0.0))[1])
        self.arrival_rate.set_function(arrival_rate)

    def reloaded(self, outcome: str) -> None:
        self._reloads[outcome].inc()

    def request_done(self, outcome: str, duration_s: float, exemplar: dict[str, str] | None = None) -> None:
        self._answered.observe(outcome, duration_s, exemplar)

    def rejected(self, reason: str) -> None:
        self._rejections[reason].inc()

    # BatchObserver, for the batcher.
    def batch_dispatched(self, size: int, waited_s: float) -> None:
        self.batch_size.observe(size)
        self.batch_wait.observe(waited_s)

    def batch_isolated(self, extra_calls: int, failed_items: int) -> None:
        self.isolation_calls.inc(extra_calls)
        self.isolated_failures.inc(failed_items)

    def batch_planned(self, size: int, go: bool) -> None:
        self.planned_batch_size.set(size)

    def objective_checked(self, items: int, late: int) -> None:
        self.objective_items.inc(items)
        self.objective_missed.inc(late)

    def class_refused(self, priority_class: str, reason: str, items: int) -> None:
        self.classes.refused(priority_class, reason, items)

    def class_served(self, priority_class: str, caller: str, waited_s: float) -> None:
        self.classes.served(priority_class, caller, waited_s)

    def batch_finished(self, size: int, duration_s: float, failed: bool) -> None:
        self.batch_execution.observe(duration_s)
        if failed:
            self.batch_failures.inc()


class AnsweredRequests(Collector):
    """`batchd_requests_total` and `batchd_request_duration_seconds`, by outcome, as a Counter and a
    Histogram would expose them, every series there from the start.

    They move on every request, and prometheus-client's Counter and Histogram take a lock for
    each change (three a request: about 4 us, a twelfth of the replica's CPU per request on a
    trivial model). Here a request adds to plain numbers, on the event loop that answers it, and
    the families are made when the registry is read.

    Where the replica traces, each bucket keeps the trace id of the last recorded request that fell
    in it as its exemplar (OpenMetrics), so that a slow bucket leads to a trace of its own."""

    def __init__(self, registry: CollectorRegistry, labels: Sequence[str], values: Sequence[str]) -> None:
        self._labels = (*labels, "outcome")
        self._values = tuple(values)
        self._bounds = SECONDS_BUCKETS
        # Per outcome: how many answers fell in each bucket (not cumulative; the last is +Inf).
        self._buckets = {o: [0] * (len(SECONDS_BUCKETS) + 1) for o in OUTCOMES}
        self._sums = dict.fromkeys(OUTCOMES, 0.0)
        self._exemplars: dict[str, list[Exemplar | None]] = {
            o: [None] * (len(SECONDS_BUCKETS) + 1) for o in OUTCOMES
        }
        self._created = time.time()
        registry.register(self)

    def observe(self, outcome: str, duration_s: float, exemplar: dict[str, str] | None = None) -> None:
        bucket = bisect_left(self._bounds, duration_s)
        self._buckets[outcome][bucket] += 1
        self._sums[outcome] += duration_s
        if exemplar is not None:
            self._exemplars[outcome][bucket] = Exemplar(exemplar, duration_s, time.time())

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "batchd_requests", "Inference requests answered, by outcome.", labels=self._labels
        )
        durations = HistogramMetricFamily(
            "batchd_request_duration_seconds",
            "From a request arriving to its answer, by outcome.",
            labels=self._labels,
        )
        for outcome in OUTCOMES:
            values = [*self._values, outcome]
            cumulative = cumulative_buckets(self._bounds, self._buckets[outcome])
            running = int(cumulative[-1][1])
            requests.add_metric(values, running, created=self._created)
            exemplars = list(self._exemplars[outcome])
            buckets = [
                (bound, count) if exemplar is None else (bound, count, exemplar)
                for (bound, count), exemplar in zip(cumulative, exemplars, strict=True)
            ]
            durations.add_metric(values, buckets, self._sums[outcome])
            durations.add_sample(
                "batchd_request_duration_seconds_created",
                dict(zip(self._labels, values, strict=True)),
                self._created,
            )
        yield requests
        yield durations


def cumulative_buckets(bounds: Sequence[float], counts: Sequence[int]) -> list[tuple[str, float]]:
    """A histogram's buckets as Prometheus exposes them (each counts every value up to its bound,
    the last +Inf), from counts per bucket (`counts` is copied first: values may land meanwhile)."""
    cumulative, running = [], 0
    for bound, count in zip((*map(floatToGoString, bounds), "+Inf"), list(counts), strict=True):
        running += count
        cumulative.append((bound, float(running)))
    return cumulative


CLASS_REFUSALS = ("queue_full", "shed", "displaced", "queue_timeout")


class ClassFigures(Collector):
    """Priority classes and tenants (`batching.priority_classes`, `spec.access`): queue depth,
    refusals and queue wait by class, and items served by tenant, made when the registry is read.
    Tenants are declared (and `anonymous`), so no id a client chooses becomes a label."""

    def __init__(self, registry: CollectorRegistry, labels: Sequence[str], values: Sequence[str]) -> None:
        self._labels, self._values = tuple(labels), tuple(values)
        self._depths: Callable[[], Iterable[tuple[str, int]]] = lambda: ()
        self._refused: dict[tuple[str, str], int] = {}
        self._waits: dict[str, list[int]] = {}
        self._wait_sums: dict[str, float] = {}
        self._served: dict[str, int] = {}
        registry.register(self)

    def track(self, depths: Callable[[], Iterable[tuple[str, int]]]) -> None:
        self._depths = depths

    def refused(self, priority_class: str, reason: str, items: int) -> None:
        key = (priority_class, reason)
        self._refused[key] = self._refused.get(key, 0) + items

    def served(self, priority_class: str, line: str, waited_s: float) -> None:
        waits = self._waits.get(priority_class)
        if waits is None:
            waits = self._waits[priority_class] = [0] * (len(SECONDS_BUCKETS) + 1)
            self._wait_sums[priority_class] = 0.0
        waits[bisect_left(SECONDS_BUCKETS, waited_s)] += 1
        self._wait_sums[priority_class] += waited_s
        tenant = tenant_of(line)
        self._served[tenant] = self._served.get(tenant, 0) + 1

    def collect(self) -> Iterator[Metric]:
        by_class = (*self._labels, "priority_class")
        depth = GaugeMetricFamily(
            "batchd_class_queue_depth", "Items waiting to join a batch, by priority class.", labels=by_class
        )
        depths = list(self._depths())
        for priority_class, items in depths:
            depth.add_metric([*self._values, priority_class], items)
        refused = CounterMetricFamily(
            "batchd_class_refusals",
            "Items refused by priority class and reason: queue_full, shed (a sheddable class past its "
            "mark), displaced (its place taken by a higher class) or queue_timeout (still queued after "
            "its class's queue_timeout_s).",
            labels=(*by_class, "reason"),
        )
        # Every class's series from the start (zero until a refusal), so that a rate reads 0, not nothing.
        refusals = {(name, reason): 0 for name, _ in depths for reason in CLASS_REFUSALS} | self._refused
        for (priority_class, reason), items in refusals.items():
            refused.add_metric([*self._values, priority_class, reason], items)
        waits = HistogramMetricFamily(
            "batchd_class_queue_wait_seconds",
            "From an item arriving to its batch leaving for the model, by priority class.",
            labels=by_class,
        )
        for priority_class, counts in dict(self._waits).items():
            buckets = cumulative_buckets(SECONDS_BUCKETS, counts)
            waits.add_metric([*self._values, priority_class], buckets, self._wait_sums[priority_class])
        served = CounterMetricFamily(
            "batchd_tenant_items",
            "Items sent to the model, by tenant (`spec.access`; every caller of an open deployment "
            "is `anonymous`).",
            labels=(*self._labels, "tenant"),
        )
        for tenant, items in dict(self._served).items():
            served.add_metric([*self._values, tenant], items)
        yield from (depth, refused, waits, served)


# Per-token latencies: from a few milliseconds (a decoding step on a GPU) to seconds (a CPU under load).
TOKEN_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5)
TOKENS_BUCKETS = (1, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


class GenerationMetrics:
    """Text generation's metrics (text-generation models only), on a replica's registry.

    Time to first token and time per output token are what a streaming client feels; running and
    waiting sequences and the KV cache's use are the scheduler's state (read at scrape time).
    """

    def __init__(self, registry: CollectorRegistry, deployment: str, model: str) -> None:
        labels = ("deployment", "model")
        values = (deployment, model)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=registry).labels(*values)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=registry).labels(*values)

        self.time_to_first_token = histogram(
            "batchd_time_to_first_token_seconds",
            "From a generation request's admission to its first new token.",
            SECONDS_BUCKETS,
        )
        self.time_per_output_token = histogram(
            "batchd_time_per_output_token_seconds",
            "Per request, the mean time between its new tokens after the first (streamed tokens only).",
            TOKEN_SECONDS_BUCKETS,
        )
        self.generated_tokens = Counter(
            "batchd_generated_tokens",
            "New tokens generated for finished requests.",
            labels,
            registry=registry,
        ).labels(*values)
        self.prompt_tokens = Counter(
            "batchd_prompt_tokens",
            "Prompt tokens of finished generation requests.",
            labels,
            registry=registry,
        ).labels(*values)
        self.tokens_per_request = histogram(
            "batchd_generated_tokens_per_request", "New tokens of each finished request.", TOKENS_BUCKETS
        )
        self.step_duration = Histogram(
            "batchd_generation_step_seconds",
            "One forward pass of token-level scheduling, by kind: prefill (new sequences) or decode.",
            (*labels, "kind"),
            buckets=SECONDS_BUCKETS,
            registry=registry,
        )
        self._steps = {kind: self.step_duration.labels(*values, kind) for kind in ("prefill", "decode")}
        self.running_sequences = gauge("batchd_running_sequences", "Sequences being generated now.")
        self.waiting_sequences = gauge(
            "batchd_waiting_sequences", "Admitted sequences waiting for a free row."
        )
        self.kv_cache_usage = gauge(
            "batchd_kv_cache_usage_ratio",
            "Tokens held in the KV cache over its bound (max_batch_size sequences of the model's context).",
        )
        self.prefix_cache = PrefixCacheFigures(registry, labels, values)

    def track(
        self, running: Callable[[], float], waiting: Callable[[], float], kv_usage: Callable[[], float]
    ) -> None:
        """Read the scheduler's state at scrape time."""
        self.running_sequences.set_function(running)
        self.waiting_sequences.set_function(waiting)
        self.kv_cache_usage.set_function(kv_usage)

    # SequenceObserver, for the generation service.
    def first_token(self, seconds: float, exemplar: dict[str, str] | None = None) -> None:
        self.time_to_first_token.observe(seconds, exemplar)

    def sequence_done(self, prompt_tokens: int, generated_tokens: int, per_token_s: float | None) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self.generated_tokens.inc(generated_tokens)
        self.tokens_per_request.observe(generated_tokens)
        if per_token_s is not None:
            self.time_per_output_token.observe(per_token_s)

    # StepObserver, for the engine (called from its thread; prometheus_client is thread-safe).
    def step_done(self, kind: str, sequences: int, duration_s: float) -> None:
        self._steps[kind].observe(duration_s)


class PrefixCacheState(Protocol):
    """What the prefix cache tells its metrics (`generation.prefix_cache.PrefixCache`)."""

    @property
    def stats(self) -> PrefixCacheCounts: ...

    @property
    def bytes_held(self) -> int: ...

    @property
    def capacity_bytes(self) -> int: ...


class PrefixCacheCounts(Protocol):
    @property
    def queried_tokens(self) -> int: ...

    @property
    def hit_tokens(self) -> int: ...

    @property
    def evicted_blocks(self) -> int: ...


class PrefixCacheFigures(Collector):
    """The prefix cache's counters and size, read from the engine's own plain numbers at scrape
    time (the engine's thread counts without a lock). Its hit rate is
    rate(batchd_prefix_cache_hit_tokens_total) / rate(batchd_prefix_cache_queried_tokens_total).
    Zero until a token-level generation service tracks its cache (request-level keeps none)."""

    def __init__(self, registry: CollectorRegistry, labels: Sequence[str], values: Sequence[str]) -> None:
        self._labels, self._values = tuple(labels), list(values)
        self._cache: Callable[[], PrefixCacheState | None] = lambda: None
        self._created = time.time()
        registry.register(self)

    def track(self, cache: Callable[[], PrefixCacheState | None]) -> None:
        self._cache = cache

    def collect(self) -> Iterator[Metric]:
        cache = self._cache()
        stats = cache.stats if cache is not None else None

        def counter(name: str, doc: str, value: int) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=self._labels)
            family.add_metric(self._values, value, created=self._created)
            return family

        def gauge(name: str, doc: str, value: int) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=self._labels)
            family.add_metric(self._values, value)
            return family

        yield counter(
            "batchd_prefix_cache_queried_tokens",
            "Prompt tokens of new sequences looked up in the prefix cache.",
            stats.queried_tokens if stats else 0,
        )
        yield counter(
            "batchd_prefix_cache_hit_tokens",
            "Of those, the tokens found cached and copied, not computed (the answers' cached_tokens); "
            "over the queried tokens: the hit rate.",
            stats.hit_tokens if stats else 0,
        )
        yield counter(
            "batchd_prefix_cache_evicted_blocks",
            "Blocks (16 tokens each) evicted, least recently used first, to stay within prefix_cache_bytes.",
            stats.evicted_blocks if stats else 0,
        )
        yield gauge(
            "batchd_prefix_cache_bytes",
            "Bytes of keys and values the prefix cache holds.",
            cache.bytes_held if cache is not None else 0,
        )
        yield gauge(
            "batchd_prefix_cache_capacity_bytes",
            "The prefix cache's bound (model.generation.prefix_cache_bytes, or the size it was given "
            "from the pod's memory); 0: off.",
            cache.capacity_bytes if cache is not None else 0,
        )
