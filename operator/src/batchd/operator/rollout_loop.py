"""The canary's judge: every `analysis.interval_s`, the figures of each revision, and the rollout moved.

Called by the scaling loop at each of its polls for every resource whose rollout is judged
(`rollout.JUDGED`). It reads every serving replica's answers (`analysis`), keeps each one's
counts at the start of the step (so the window is exactly the step, whichever replicas came and
went), judges the canary against the stable revision, and, when the judgement moves the rollout
(rolled back, next step, promotion), writes `status.rollout`, announces it, and converges the
resource so that its children follow at once. A restarted operator starts the window again at
its first judgement: the step itself (and its hold) comes from the status.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from batchd.api.manifest import ManifestError, parse_manifest
from batchd.api.spec import RolloutSpec
from batchd.operator import analysis, rollout
from batchd.operator.metrics import record_step
from batchd.operator.reconcile import Reconciler, announce_rollout
from batchd.operator.replicas import ReplicaPod, read_text

logger = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name) of a BatchedDeployment
Window = tuple[str, int, str]  # (canary revision, step, when it started): one step of one rollout


@dataclass
class RolloutJudge:
    reconciler: Reconciler
    session: aiohttp.ClientSession
    # Per resource: the step being judged, and each replica's answers at its start (by pod name).
    starts: dict[Key, tuple[Window, dict[str, analysis.Answers]]] = field(default_factory=dict)
    last_judged: dict[Key, float] = field(default_factory=dict)

    def forget(self, key: Key) -> None:
        self.starts.pop(key, None)
        self.last_judged.pop(key, None)

    async def tick(self, key: Key, body: Mapping[str, Any], pods: Sequence[ReplicaPod]) -> None:
        current = rollout.Rollout.from_status(body.get("status") or {})
        if current.phase not in rollout.JUDGED:
            self.forget(key)
            return
        document = {k: body.get(k) for k in ("apiVersion", "kind", "metadata", "spec")}
        try:
            spec = parse_manifest(document, origin="{}/{}".format(*key)).spec.rollout
        except ManifestError:
            return  # converge reports it
        now = time.monotonic()
        if now - self.last_judged.get(key, -spec.analysis.interval_s) < spec.analysis.interval_s:
            return
        self.last_judged[key] = now
        serving = [pod for pod in pods if pod.serving]
        wall = datetime.datetime.now(datetime.UTC)
        if current.step_started_at:
            after = await self._judge(key, current, spec, serving, wall)
        elif any(pod.canary for pod in serving):  # the first step begins: judged from the next look
            after = rollout.serving(current, wall)
        else:
            return
        if after != current and await self._write(key, current, after):
            announce_rollout(body, current, after)
            await self.reconciler.converge(*key, logger)

    async def _judge(
        self,
        key: Key,
        current: rollout.Rollout,
        spec: RolloutSpec,
        serving: Sequence[ReplicaPod],
        wall: datetime.datetime,
    ) -> rollout.Rollout:
        """The rollout after a judgement of the step's window so far."""
        readings = await self._read(serving)
        canary_pods = {pod.name for pod in serving if pod.canary}
        window: Window = (current.canary_revision, current.step, current.step_started_at)
        started = self.starts.get(key)
        if started is None or started[0] != window:
            started = (window, analysis.step_starts(readings, canary_pods, first_step=current.step == 0))
            self.starts[key] = started
        canary, stable = analysis.windows(readings, started[1], canary_pods)
        verdict = analysis.judge(canary, stable, spec.analysis)
        record_step(*key, canary, stable)
        logger.debug("%s/%s: %s", *key, verdict.figures)
        passed = verdict.enough and rollout.step_elapsed(current, spec.canary_steps, wall)
        return rollout.judged(current, spec.canary_steps, verdict.failure, passed, wall)

    async def _read(self, pods: Sequence[ReplicaPod]) -> dict[str, analysis.Answers]:
        """Each pod's answers so far, by name; a pod that cannot say is left out of this look."""
        timeout_s = self.reconciler.settings.replica_poll_timeout_s
        texts = await asyncio.gather(*(read_text(self.session, pod, "/metrics", timeout_s) for pod in pods))
        readings = {}
        for pod, text in zip(pods, texts, strict=True):
            if text is None:
                continue
            try:
                readings[pod.name] = analysis.parse_answers(text)
            except ValueError as error:
                logger.debug("reading %s's answers: %s", pod.name, error)
        return readings

    async def _write(self, key: Key, current: rollout.Rollout, after: rollout.Rollout) -> bool:
        """`status.rollout` moved from `current` to `after`, unless a converge moved it meanwhile
        (a new spec): then this judgement is of a rollout that is no more."""
        path = self.reconciler.parent_path(*key, "status")
        async with self.reconciler.locks[key]:
            live = await self.reconciler.api.get(self.reconciler.parent_path(*key))
            if live is None or rollout.Rollout.from_status(live.get("status") or {}) != current:
                return False
            await self.reconciler.api.merge_patch(path, {"status": {"rollout": after.to_status()}})
        return True
