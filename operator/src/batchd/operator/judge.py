"""The canary's judge, fed by the poller: the rollout moved by what the replicas of each revision do.

At every poll it looks at the canary's pods, by their revision label: once enough of them are
Ready for the step's share, the share goes to the canary (`rollout.carried`); when they are not
by the progress deadline, the revision is rolled back (`rollout.past_deadline`). Every
`analysis.interval_s` of a step being carried it reads every serving replica's answers
(`analysis`), keeps each replica's counts at the start of the step (by the replica's identity,
so a restarted one counts from zero again), and judges the canary's revision against the stable
one's over the same window. A move is written to `status.rollout`, guarded by the rollout it was
computed from, announced, and the resource converged so that its children follow at once. A
restarted operator starts the window again at its first judgement: the step itself (and its
hold) comes from the status.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from batchd.api.status import BatchedDeploymentStatus, RolloutStatus
from batchd.operator import analysis, rollout
from batchd.operator.autoscaler import desired_replicas
from batchd.operator.cluster import Cluster
from batchd.operator.metrics import record_step
from batchd.operator.reconcile import Reconciler, announce_rollout
from batchd.operator.replicas import Reading, ReplicaPod
from batchd.operator.resource import Key, Resource

logger = logging.getLogger(__name__)

Window = tuple[str, int, datetime.datetime | None]  # (canary revision, step, when it started)


@dataclass
class Judge:
    cluster: Cluster
    reconciler: Reconciler
    # Per resource: the step being judged, and each replica's answers at its start (by identity).
    starts: dict[Key, tuple[Window, dict[str, analysis.Answers]]] = field(default_factory=dict)
    last_judged: dict[Key, float] = field(default_factory=dict)

    def forget(self, key: Key) -> None:
        self.starts.pop(key, None)
        self.last_judged.pop(key, None)

    def wants_answers(self, resource: Resource) -> bool:
        """Whether this poll should read the replicas' answers: a step is carried and its
        judgement is due."""
        current = resource.status.rollout
        if resource.bd is None or current is None or current.phase not in rollout.JUDGED:
            return False
        if current.step_started_at is None:
            return False
        interval_s = resource.bd.spec.rollout.analysis.interval_s
        return time.monotonic() - self.last_judged.get(resource.key, -interval_s) >= interval_s

    async def feed(
        self, resource: Resource, pods: Sequence[ReplicaPod], readings: Sequence[Reading] | None
    ) -> None:
        """One poll: `readings` with answers when `wants_answers` said so, else None."""
        current, bd = resource.status.rollout, resource.bd
        if bd is None or current is None or current.phase not in rollout.JUDGED:
            self.forget(resource.key)
            return
        spec, now = bd.spec.rollout, datetime.datetime.now(datetime.UTC)
        steps = spec.canary_steps
        desired = desired_replicas(bd, resource.status.desired_replicas)
        ready = sum(1 for pod in pods if pod.serving and pod.revision == current.canary_revision)
        after = rollout.carried(current, steps, ready, desired, now)
        after = rollout.past_deadline(after, spec, ready, desired, now)
        if readings is not None and after == current:
            self.last_judged[resource.key] = time.monotonic()
            after = self._judged(resource, current, readings, now)
        if after != current:
            await self._move(resource, current, after)

    def _judged(
        self, resource: Resource, current: RolloutStatus, readings: Sequence[Reading], now: datetime.datetime
    ) -> RolloutStatus:
        """The rollout after a judgement of the step's window so far."""
        assert resource.bd is not None
        spec = resource.bd.spec.rollout
        answers = {
            reading.pod.identity: reading.answers for reading in readings if reading.answers is not None
        }
        canary = {
            reading.pod.identity for reading in readings if reading.pod.revision == current.canary_revision
        }
        stable = {
            reading.pod.identity for reading in readings if reading.pod.revision == resource.status.revision
        }
        window: Window = (current.canary_revision, current.step, current.step_started_at)
        started = self.starts.get(resource.key)
        if started is None or started[0] != window:
            started = (window, analysis.step_starts(answers, canary, first_step=current.step == 0))
            self.starts[resource.key] = started
        canary_window, stable_window = analysis.windows(answers, started[1], canary, stable)
        verdict = analysis.judge(canary_window, stable_window, spec.analysis)
        record_step(*resource.key, canary_window, stable_window)
        logger.debug("%s/%s: %s", *resource.key, verdict.figures)
        passed = verdict.enough and rollout.step_elapsed(current, spec.canary_steps, now)
        return rollout.judged(current, spec.canary_steps, verdict.failure, passed, now)

    async def _move(self, resource: Resource, current: RolloutStatus, after: RolloutStatus) -> None:
        """`status.rollout` moved, unless a converge moved it meanwhile (a new spec): then this
        judgement is of a rollout that is no more."""
        async with self.cluster.locks[resource.key]:
            written = await self.cluster.write_status(
                resource, BatchedDeploymentStatus(rollout=after), guarded=["rollout"]
            )
        if written:
            announce_rollout(resource.body, current, after)
            await self.reconciler.converge(*resource.key, logger)
