"""Which replica takes a request: the less loaded of two picked at random (power of two choices).

Sending every request to the least loaded replica makes every router that sees the same numbers
pick the same replica at once (herding); picking at random ignores load. Two random choices and
the better of them keeps queues within a small constant of the best with stale or partial load,
which is why Ray Serve's proxy and the Gateway API endpoint picker do it. Pure functions: the
load of a replica is whatever the caller says it is.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Sequence


def pick(
    replicas: Sequence[str],
    load: Callable[[str], float],
    rng: random.Random,
    exclude: Collection[str] = (),
) -> str | None:
    """The less loaded of two distinct replicas drawn at random, leaving out `exclude`; the only
    one when one is left; None when none is."""
    candidates = [replica for replica in replicas if replica not in exclude] if exclude else replicas
    if not candidates:
        return None
    if len(candidates) == 1:
        return candidates[0]
    first, second = rng.sample(candidates, 2)
    # A tie goes to the first draw, itself random: equal replicas share the load evenly.
    return second if load(second) < load(first) else first


def estimated_items(own_now: int, polled_items: int | None, own_at_poll: int) -> float:
    """What a replica holds now: the router's own requests in flight to it (exact), plus what others
    had sent it at the last `GET /load` (the replica's items less the router's own at that moment)."""
    if polled_items is None:
        return float(own_now)
    return float(own_now + max(0, polled_items - own_at_poll))
