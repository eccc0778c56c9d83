"""How many replicas a BatchedDeployment should have, from the load its replicas report.

Pure: no API calls, no clocks of its own. Each observation gives the items the ready replicas
hold (queued or in the model); the load alone asks for `ceil(load / target_ongoing_items)`
replicas, within `min_replicas..max_replicas` (Ray Serve's rule). The count then follows the
stabilization windows of Kubernetes' HPA: it rises to the *lowest* ask of the last
`upscale_delay_s` (so a burst shorter than that adds nothing) and falls to the *highest* ask of
the last `downscale_delay_s` (so load that returns within that never finds the replicas gone).
Steady load that wobbles around a boundary therefore never flaps: the count can go up only when
every recent ask was higher, and down only when every recent ask was lower. An ask stands until
the next observation, so the one in force when a window opens counts too: after a gap between
observations (a poll slowed by a starved node or an unanswering replica) the first ask after it
cannot decide alone, where a window holding only the asks made inside it would let it.

Scale to zero (Knative's activator and Ray Serve's `downscale_to_zero_delay_s`): the windows above
never go below one replica. With `min_replicas: 0` the last replica goes only after the deployment
has been idle, no item on its replicas and no request held by any router, for
`scale_to_zero_delay_s`. At zero, requests wait in the routers, and any held request wakes the
deployment at once, with no upscale delay (a held request is a client waiting):
`max(1, ceil(held / target_ongoing_items))` replicas within the bounds.
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
    scale_to_zero_delay_s: float = 300.0
    count_sheddable: bool = False  # whether items of sheddable classes count as load

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
            autoscaling.scale_to_zero_delay_s,
            autoscaling.count_sheddable,
        )

    def bounded(self, replicas: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, replicas))


@dataclass(frozen=True)
class Held:
    """What the routers hold for one deployment while it has no ready replica, summed over routers."""

    requests: int = 0
    oldest_s: float = 0.0  # how long the oldest of them has waited

    def __add__(self, other: Held) -> Held:
        return Held(self.requests + other.requests, max(self.oldest_s, other.oldest_s))


NOTHING_HELD = Held()


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
        self._idle_since: float | None = None  # since when no item and no held request was seen

    def decide(
        self,
        policy: Policy,
        current: int,
        load: int,
        ready: int,
        now: float,
        held: Held = NOTHING_HELD,
        uncounted: int = 0,
    ) -> Decision:
        """The count for `load` items over `ready` replicas, and the requests the routers `held`,
        observed at `now` (seconds, monotonic); `uncounted`: items on the replicas left out of
        `load` (sheddable ones), which add no replica but keep the deployment from being idle.

        Held requests count as load: each is at least one item waiting for a replica."""
        demand = load + held.requests
        wanted = math.ceil(demand / policy.target_ongoing_items)
        recommended = policy.bounded(max(1, wanted))  # the windows never ask for zero
        if self._since is None:
            self._since = now
        self._asks.append((now, recommended))
        longest = max(policy.upscale_delay_s, policy.downscale_delay_s)
        # Keep the ask in force when the longest window opens: the last one made at or before it.
        while len(self._asks) > 1 and self._asks[1][0] <= now - longest:
            self._asks.popleft()
        if demand or uncounted:
            self._idle_since = None
        elif self._idle_since is None:
            self._idle_since = now

        if current != policy.bounded(current):
            bound = "min_replicas" if current < policy.min_replicas else "max_replicas"
            return Decision(policy.bounded(current), recommended, f"{bound} is {policy.bounded(current)}")
        if current == 0:
            return self._wake(policy, held)
        seen = f"load {load} item(s) on {ready} ready replica(s), target {policy.target_ongoing_items} each"
        if held.requests:
            seen += f", {held.requests} request(s) held by the routers"
        rise = self._held(now, policy.upscale_delay_s, min)
        if rise is not None and rise > current:
            return Decision(rise, recommended, f"{seen}: {rise} wanted for {policy.upscale_delay_s:g} s")
        fall = self._held(now, policy.downscale_delay_s, max)
        if fall is not None and fall < current:
            return Decision(fall, recommended, f"{seen}: {fall} enough for {policy.downscale_delay_s:g} s")
        if current == 1 and self._idle_for(now, policy):
            reason = (
                f"idle for {policy.scale_to_zero_delay_s:g} s: no item on the replicas, "
                "no request held by the routers"
            )
            return Decision(0, 0, reason)
        return Decision(current, recommended, "")

    def unobserved(self) -> None:
        """Replicas exist but none answered (starting, loading the model): not a sign of idleness,
        so the scale-to-zero window starts again once they answer."""
        self._idle_since = None

    def _wake(self, policy: Policy, held: Held) -> Decision:
        """At zero only a held request starts a replica, at once: someone is waiting for it."""
        if not held.requests:
            return Decision(0, 0, "")
        replicas = policy.bounded(max(1, math.ceil(held.requests / policy.target_ongoing_items)))
        reason = f"{held.requests} request(s) held by the routers, the oldest waited {held.oldest_s:.1f} s"
        return Decision(replicas, replicas, reason)

    def _idle_for(self, now: float, policy: Policy) -> bool:
        """Whether the last replica may go: min_replicas 0 and idle for the whole delay (never
        before this autoscaler has watched that long: `_idle_since` is at or after `_since`)."""
        if policy.min_replicas > 0 or self._idle_since is None:
            return False
        return now - self._idle_since >= policy.scale_to_zero_delay_s

    def _held(self, now: float, window_s: float, pick: Callable[[Iterable[int]], int]) -> int | None:
        """The lowest (min) or highest (max) ask in force during the last `window_s`: those made
        within it and the one standing when it opened; None until this autoscaler has watched for
        that long, so that a restarted operator scales nothing early."""
        assert self._since is not None
        opened = now - window_s
        if now - self._since < window_s:
            return None
        standing = [replicas for at, replicas in self._asks if at <= opened][-1:]
        return pick([*standing, *(replicas for at, replicas in self._asks if at > opened)])
