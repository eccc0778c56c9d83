"""A canary rollout's state (`status.rollout`) and how it moves: pure functions, no API calls.

The state lives in the resource's status, stable revision included (its `model` and `image`), so
a restarted operator renders the same children and goes on from the same step. Three things move
it: a new spec (`plan`, at every converge), a judgement of the step's figures (`judged`, by the
rollout loop every `analysis.interval_s`), and the stable Deployment having rolled to the new
revision (`promoted`).

    (new revision) -> Progressing -> (each step passed) -> ... -> Promoting -> Promoted
                          |  ^ paused / resumed                       (the stable Deployment
                          v  |                                         rolls to the new revision)
                        Paused          any step failed -> RolledBack (stays, until a new revision)
                                        spec.rollout.abort -> Aborted (until abort is false again)
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from batchd.api.spec import BatchedDeployment, CanaryStep, ModelSpec
from batchd.operator.status import Condition, condition, stamp

NONE = ""
PROGRESSING = "Progressing"
PAUSED = "Paused"
PROMOTING = "Promoting"
PROMOTED = "Promoted"
ROLLED_BACK = "RolledBack"
ABORTED = "Aborted"
# The canary takes its step's share of the requests in these phases.
SERVING = frozenset({PROGRESSING, PAUSED, PROMOTING})
# The canary's children exist in these (at zero replicas when it was rolled back or aborted).
WITH_CANARY = SERVING | {ROLLED_BACK, ABORTED}
# Judged against the analysis: a failed judgement rolls these back.
JUDGED = frozenset({PROGRESSING, PAUSED})


@dataclass(frozen=True)
class Rollout:
    """`status.rollout`: where a canary rollout stands, and what the stable revision runs."""

    phase: str = NONE
    canary_revision: str = ""
    step: int = 0  # index into the spec's canary steps
    canary_percent: int = 0  # the canary's share of the requests now (the router reads it)
    step_started_at: str = ""
    message: str = ""
    stable_model: Mapping[str, Any] = field(default_factory=dict)  # spec.model of the stable revision
    stable_image: str = ""  # spec.image of the stable revision ("" for the operator's default)

    @classmethod
    def from_status(cls, status: Mapping[str, Any]) -> Rollout:
        found = status.get("rollout") or {}
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in found.items() if key in known and value is not None})

    def to_status(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "stable_model": dict(self.stable_model)}

    @property
    def serving_canary(self) -> bool:
        return self.phase in SERVING


def stable_of(bd: BatchedDeployment, rollout: Rollout) -> BatchedDeployment:
    """The resource as its stable revision runs it: its spec with the stable `model` and `image`
    (the spec itself when no stable revision is recorded yet)."""
    if not rollout.stable_model:
        return bd
    spec = bd.spec.model_copy(
        update={
            "model": ModelSpec.model_validate(dict(rollout.stable_model)),
            "image": rollout.stable_image or None,
        }
    )
    return bd.model_copy(update={"spec": spec})


def _stable_fields(bd: BatchedDeployment) -> dict[str, Any]:
    """The stable revision is `bd`'s."""
    return {
        "stable_model": bd.spec.model.model_dump(mode="json", by_alias=True, exclude_none=True),
        "stable_image": bd.spec.image or "",
    }


def _step_message(steps: Sequence[CanaryStep], step: int) -> str:
    return f"step {step + 1} of {len(steps)}: {steps[step].traffic_percent}% of the requests"


def plan(
    bd: BatchedDeployment, spec_revision: str, stable_revision: str, old: Rollout, now: datetime.datetime
) -> Rollout:
    """The rollout a converge applies for the spec as it is now (`old`: as the status has it)."""
    rollout = bd.spec.rollout
    if rollout.strategy != "canary" or spec_revision == stable_revision:
        # Nothing to judge: the stable revision is the spec's (a rolling update, if it changed).
        if old.phase == PROMOTED:  # the last rollout's outcome stays in view
            return Rollout(phase=PROMOTED, message=old.message, **_stable_fields(bd))
        return Rollout(**_stable_fields(bd))
    steps = rollout.canary_steps
    first = dataclasses.replace(
        old,
        phase=PROGRESSING,
        canary_revision=spec_revision,
        step=0,
        canary_percent=steps[0].traffic_percent,
        step_started_at="",  # once a canary replica serves (`serving`)
        message=f"revision {spec_revision}: {_step_message(steps, 0)}",
    )
    if old.canary_revision != spec_revision:
        # A new revision, or another one during a rollout: it replaces the canary, from step one.
        old = first
    elif old.phase in (ROLLED_BACK, PROMOTING):
        return old  # a judged revision is not judged again; a promotion runs to its end
    if rollout.abort:
        return dataclasses.replace(
            old,
            phase=ABORTED,
            canary_percent=0,
            message=f"revision {spec_revision}: aborted (spec.rollout.abort)",
        )
    if old.phase == ABORTED:
        return first
    if rollout.paused:
        return dataclasses.replace(old, phase=PAUSED)
    if old.phase == PAUSED:  # resumed: the step's hold starts again
        return dataclasses.replace(
            old, phase=PROGRESSING, step_started_at=stamp(now) if old.step_started_at else ""
        )
    return old


def judged(
    old: Rollout, steps: Sequence[CanaryStep], failure: str | None, step_passed: bool, now: datetime.datetime
) -> Rollout:
    """After a judgement of the step so far: rolled back on a `failure` (what failed, with the
    figures); on to the next step, or to promotion after the last, once `step_passed`."""
    if old.phase not in JUDGED:
        return old
    if failure is not None:
        return dataclasses.replace(
            old, phase=ROLLED_BACK, canary_percent=0, message=f"revision {old.canary_revision}: {failure}"
        )
    if old.phase != PROGRESSING or not step_passed:
        return old
    following = old.step + 1
    if following < len(steps):
        return dataclasses.replace(
            old,
            step=following,
            canary_percent=steps[following].traffic_percent,
            step_started_at=stamp(now),
            message=f"revision {old.canary_revision}: {_step_message(steps, following)}",
        )
    return dataclasses.replace(
        old,
        phase=PROMOTING,
        message=f"revision {old.canary_revision}: every step passed; the stable Deployment rolls to it",
    )


def promoted(bd: BatchedDeployment, old: Rollout) -> Rollout:
    """The stable Deployment runs the canary's revision: the canary goes."""
    return Rollout(phase=PROMOTED, message=f"revision {old.canary_revision}: promoted", **_stable_fields(bd))


def serving(rollout: Rollout, now: datetime.datetime) -> Rollout:
    """The first step begins once a replica of the canary serves: a step's hold is time the
    canary served its share, not time its pods spent starting."""
    if rollout.phase not in JUDGED or rollout.step_started_at:
        return rollout
    return dataclasses.replace(rollout, step_started_at=stamp(now))


def step_elapsed(rollout: Rollout, steps: Sequence[CanaryStep], now: datetime.datetime) -> bool:
    """Whether the step's hold has passed (not begun: it has not)."""
    if not rollout.step_started_at:
        return False
    if rollout.step >= len(steps):
        return True
    started = datetime.datetime.strptime(rollout.step_started_at, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=datetime.UTC
    )
    return (now - started).total_seconds() >= steps[rollout.step].hold_s


def canary_replicas(rollout: Rollout, desired: int) -> int:
    """The canary's replicas: its share of the deployment's count (at least one while it serves);
    none once rolled back or aborted. The stable revision keeps its full count, so that a rollback
    never waits for a replica to start."""
    if not rollout.serving_canary:
        return 0
    return max(1, math.ceil(desired * rollout.canary_percent / 100))


def conditions(from_deployment: list[Condition], rollout: Rollout, generation: int) -> list[Condition]:
    """The conditions with a rollout's: Progressing while a canary serves, and RolledBack (True
    with what failed, and the figures, once a revision was rolled back or aborted)."""
    found = {c["type"]: c for c in from_deployment}
    if rollout.serving_canary:
        found["Progressing"] = condition(
            "Progressing", True, "Canary" + rollout.phase, rollout.message, generation
        )
    if rollout.phase == ROLLED_BACK:
        found["RolledBack"] = condition("RolledBack", True, "AnalysisFailed", rollout.message, generation)
    elif rollout.phase == ABORTED:
        found["RolledBack"] = condition("RolledBack", True, "Aborted", rollout.message, generation)
    else:
        found["RolledBack"] = condition("RolledBack", False, rollout.phase or "NoRollout", "", generation)
    return list(found.values())


EVENT_REASONS = {
    PROGRESSING: "CanaryStep",
    PAUSED: "RolloutPaused",
    PROMOTING: "Promoting",
    PROMOTED: "Promoted",
    ROLLED_BACK: "RolledBack",
    ABORTED: "RolloutAborted",
}


def announcement(before: Rollout, after: Rollout) -> tuple[bool, str] | None:
    """(warning, reason) of the event for a rollout that moved to another phase or step; None
    when it did not move, or when it ended with no canary left to speak of."""
    moved = (before.phase, before.step, before.canary_revision) != (
        after.phase,
        after.step,
        after.canary_revision,
    )
    reason = EVENT_REASONS.get(after.phase)
    if not moved or reason is None:
        return None
    return after.phase in (ROLLED_BACK, ABORTED), reason
