"""How many replicas a BatchedDeployment should have, from the load its replicas report.

Pure: no API calls, no clocks of its own. Each observation gives the items the ready replicas
hold (queued or in the model); the load alone asks for `ceil(load / target_ongoing_items)`
replicas, within `min_replicas..max_replicas` (Ray Serve's rule). The count then follows the
stabilization windows of Kubernetes' HPA: it rises to the *lowest* ask of the last
`upscale_delay_s` (so a burst shorter than that adds nothing) and falls to the *highest* ask of
the last `downscale_delay_s` (so load that returns within that never finds the replicas gone).
Steady load that wobbles around a boundary therefore never flaps: the count can go up only when
every recent ask was higher, and down only when every recent ask was lower.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from batchd.api.spec import BatchedDeployment


@dataclass(frozen=True)
class Policy:
    """The autoscaling spec with its defaults filled in."""

    min_replicas: int
    max_replicas: int
    target_ongoing_items: int
    upscale_delay_s: float
    downscale_delay_s: float

    @classmethod
    def of(cls, bd: BatchedDeployment) -> Policy | None:
        autoscaling, target = bd.spec.autoscaling, bd.target_ongoing_items
        if autoscaling is None or target is None:
            return None
        return cls(
            autoscaling.min_replicas,
            autoscaling.max_replicas,
            target,
            autoscaling.upscale_delay_s,
            autoscaling.downscale_delay_s,
        )

    def bounded(self, replicas: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, replicas))


@dataclass(frozen=True)
class Decision:
    replicas: int  # what the Deployment should have now
    recommended: int  # what the load alone asks for, within the bounds
    reason: str  # why `replicas` differs from the current count ("" when it does not)


def desired_replicas(bd: BatchedDeployment, last_decision: int | None) -> int:
    """The count to ask of the Deployment now: `num_replicas` without autoscaling; with it, the
    autoscaler's last decision (kept in the status), or `num_replicas` before the first one, within
    the current bounds."""
    policy = Policy.of(bd)
    if policy is None:
        return bd.spec.num_replicas
    return policy.bounded(last_decision if last_decision is not None else bd.spec.num_replicas)


class Autoscaler:
    """The recent asks of one BatchedDeployment, and the decisions they make."""

    def __init__(self) -> None:
        self._asks: collections.deque[tuple[float, int]] = collections.deque()  # (time, recommended)
        self._since: float | None = None  # first observation: windows shorter than this are incomplete

    def decide(self, policy: Policy, current: int, load: int, ready: int, now: float) -> Decision:
        """The count for `load` items over `ready` replicas observed at `now` (seconds, monotonic)."""
        recommended = policy.bounded(math.ceil(load / policy.target_ongoing_items))
        if self._since is None:
            self._since = now
        self._asks.append((now, recommended))
        longest = max(policy.upscale_delay_s, policy.downscale_delay_s)
        while self._asks and self._asks[0][0] < now - longest:
            self._asks.popleft()

        seen = f"load {load} item(s) on {ready} ready replica(s), target {policy.target_ongoing_items} each"
        if current != policy.bounded(current):
            bound = "min_replicas" if current < policy.min_replicas else "max_replicas"
            return Decision(policy.bounded(current), recommended, f"{bound} is {policy.bounded(current)}")
        rise = self._held(now, policy.upscale_delay_s, min)
        if rise is not None and rise > current:
            return Decision(rise, recommended, f"{seen}: {rise} wanted for {policy.upscale_delay_s:g} s")
        fall = self._held(now, policy.downscale_delay_s, max)
        if fall is not None and fall < current:
            return Decision(fall, recommended, f"{seen}: {fall} enough for {policy.downscale_delay_s:g} s")
        return Decision(current, recommended, "")

    def _held(self, now: float, window_s: float, pick: Callable[[Iterable[int]], int]) -> int | None:
        """The lowest (min) or highest (max) ask within the last `window_s`; None until this
        autoscaler has watched for that long, so that a restarted operator scales nothing early."""
        assert self._since is not None
        if now - self._since < window_s:
            return None
        return pick(replicas for at, replicas in self._asks if at >= now - window_s)
