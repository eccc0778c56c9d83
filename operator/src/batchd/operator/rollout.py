"""A canary rollout's state (`status.rollout`) and how it moves: pure functions, no API calls.

The state lives in the resource's status, each revision's model and image included, so a restarted
operator renders the same children and goes on from the same step. Four things move it: a new
spec (`plan`, at every converge), the canary's replicas (`carried`, and `past_deadline` when they
never serve), a judgement of the step's figures (`judged`), and the stable Deployment having
rolled to the new revision (`promoted`).

    (new revision) -> Progressing -> (each step carried, then passed) -> Promoting -> Promoted
                          |  ^ paused / resumed                           (the stable Deployment
                          v  |                                             rolls to the new revision)
                        Paused          a step failed, or not carried in time -> RolledBack
                                        spec.rollout.abort, in any phase -> Aborted

A step's share goes to the canary only once it has the Ready replicas to carry it; until then the
router keeps the share of the step before. A change of spec during a promotion waits for the
promotion to end, then becomes a canary of its own: no revision reaches the stable Deployment
unjudged.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence

from batchd.api.spec import BatchedDeployment, CanaryStep, ModelSpec, RolloutSpec
from batchd.api.status import Condition, RolloutPhase, RolloutStatus
from batchd.operator.status import condition, stamp

NONE: RolloutPhase = ""
PROGRESSING: RolloutPhase = "Progressing"
PAUSED: RolloutPhase = "Paused"
PROMOTING: RolloutPhase = "Promoting"
PROMOTED: RolloutPhase = "Promoted"
ROLLED_BACK: RolloutPhase = "RolledBack"
ABORTED: RolloutPhase = "Aborted"
# The canary takes its step's share of the requests in these phases.
SERVING = frozenset({PROGRESSING, PAUSED, PROMOTING})
# The canary's children exist in these (at zero replicas when it was rolled back or aborted).
WITH_CANARY = SERVING | {ROLLED_BACK, ABORTED}
# Judged against the analysis: a failed judgement rolls these back.
JUDGED = frozenset({PROGRESSING, PAUSED})
# Why a revision was rolled back (`status.rollout.reason`, the RolledBack condition's reason).
ANALYSIS_FAILED = "AnalysisFailed"
PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"


def stable_of(bd: BatchedDeployment, rollout: RolloutStatus | None) -> BatchedDeployment:
    """The resource as its stable revision runs it: its spec with the stable `model` and `image`
    (the spec itself when no stable revision is recorded yet)."""
    if rollout is None or rollout.stable_model is None:
        return bd
    return _with_revision(bd, rollout.stable_model, rollout.stable_image)


def canary_of(bd: BatchedDeployment, rollout: RolloutStatus) -> BatchedDeployment:
    """The resource as the revision being rolled out runs it."""
    if rollout.canary_model is None:
        return bd
    return _with_revision(bd, rollout.canary_model, rollout.canary_image)


def _with_revision(bd: BatchedDeployment, model: ModelSpec, image: str | None) -> BatchedDeployment:
    spec = bd.spec.model_copy(update={"model": model, "image": image or None})
    return bd.model_copy(update={"spec": spec})


def _as_stable(bd: BatchedDeployment) -> RolloutStatus:
    """No rollout: the stable revision is `bd`'s."""
    return RolloutStatus(stable_model=bd.spec.model, stable_image=bd.spec.image)


def _step_message(steps: Sequence[CanaryStep], step: int, carried: bool) -> str:
    share = f"{steps[step].traffic_percent}% of the requests"
    return f"step {step + 1} of {len(steps)}: {share if carried else share + ' once its replicas are ready'}"


def plan(
    bd: BatchedDeployment,
    spec_revision: str,
    stable_revision: str,
    old: RolloutStatus | None,
    now: datetime.datetime,
    desired: int = 1,
) -> RolloutStatus:
    """The rollout a converge applies for the spec as it is now (`old`: as the status has it;
    `stable_revision`: the revision of its stable model, or of the spec when it records none;
    `desired`: the deployment's replicas)."""
    planned = _planned(bd, spec_revision, stable_revision, old, now)
    return _waiting_at_zero(planned, desired, now)


def _waiting_at_zero(rollout: RolloutStatus, desired: int, now: datetime.datetime) -> RolloutStatus:
    """A deployment with no replicas has no request to judge a canary on, and no replica to
    give it: its step waits, and its progress deadline runs only while the deployment has some."""
    if rollout.phase not in JUDGED or rollout.step_started_at is not None:
        return rollout
    if desired <= 0 and rollout.step_entered_at is not None:
        return rollout.model_copy(update={"step_entered_at": None})
    if desired > 0 and rollout.step_entered_at is None:
        return rollout.model_copy(update={"step_entered_at": stamp(now)})
    return rollout


def _planned(
    bd: BatchedDeployment,
    spec_revision: str,
    stable_revision: str,
    old: RolloutStatus | None,
    now: datetime.datetime,
) -> RolloutStatus:
    rollout = bd.spec.rollout
    if old is None or old.stable_model is None:
        return _as_stable(bd)  # a new resource: its first revision is the stable one
    if old.phase == PROMOTING:
        # A promotion runs to its end from the status (a newer spec waits for it, then becomes a
        # canary of its own), unless it is aborted: the stable Deployment then rolls back.
        return _aborted(old) if rollout.abort else old
    if rollout.strategy != "canary" or spec_revision == stable_revision:
        # Nothing to judge: the stable revision is the spec's (a rolling update, if it changed).
        if old.phase == PROMOTED:  # the last rollout's outcome stays in view
            return _as_stable(bd).model_copy(update={"phase": PROMOTED, "message": old.message})
        return _as_stable(bd)
    steps = rollout.canary_steps
    first = RolloutStatus(
        phase=PROGRESSING,
        canary_revision=spec_revision,
        step_entered_at=stamp(now),
        message=f"revision {spec_revision}: {_step_message(steps, 0, carried=False)}",
        stable_model=old.stable_model,
        stable_image=old.stable_image,
        canary_model=bd.spec.model,
        canary_image=bd.spec.image,
    )
    if old.canary_revision != spec_revision:
        # A new revision, or another one during a rollout: it replaces the canary, from step one.
        old = first
    elif old.phase == ROLLED_BACK:
        return old  # a judged revision is not judged again
    if rollout.abort:
        return _aborted(old)
    if old.phase == ABORTED:
        return first
    if rollout.paused:
        return old.model_copy(update={"phase": PAUSED})
    if old.phase == PAUSED:  # resumed: the step's hold and its deadline start again
        return old.model_copy(
            update={
                "phase": PROGRESSING,
                "step_entered_at": stamp(now),
                "step_started_at": stamp(now) if old.step_started_at else None,
            }
        )
    return old


def _aborted(old: RolloutStatus) -> RolloutStatus:
    return old.model_copy(
        update={
            "phase": ABORTED,
            "canary_percent": 0,
            "message": f"revision {old.canary_revision}: aborted (spec.rollout.abort)",
        }
    )


def target_percent(rollout: RolloutStatus, steps: Sequence[CanaryStep]) -> int:
    """The share the step being taken asks for (the last step's once past them)."""
    if not steps:
        return 100
    return steps[min(rollout.step, len(steps) - 1)].traffic_percent


def canary_replicas(rollout: RolloutStatus | None, steps: Sequence[CanaryStep], desired: int) -> int:
    """The canary's replicas: its step's share of the deployment's count, at least one while it
    serves and the deployment has any; none once rolled back or aborted. The stable revision keeps
    its full count, so that a rollback never waits for a replica to start."""
    if rollout is None or rollout.phase not in SERVING or desired <= 0:
        return 0
    return max(1, math.ceil(desired * target_percent(rollout, steps) / 100))


def carried(
    old: RolloutStatus, steps: Sequence[CanaryStep], ready_canary: int, desired: int, now: datetime.datetime
) -> RolloutStatus:
    """The step's share goes to the canary once it has the Ready replicas to carry it; its hold
    counts from then."""
    if old.phase not in JUDGED or old.step_started_at is not None:
        return old
    needed = canary_replicas(old, steps, desired)
    if needed == 0 or ready_canary < needed:
        return old
    step = min(old.step, len(steps) - 1)
    return old.model_copy(
        update={
            "canary_percent": target_percent(old, steps),
            "step_started_at": stamp(now),
            "message": f"revision {old.canary_revision}: {_step_message(steps, step, carried=True)}",
        }
    )


def past_deadline(
    old: RolloutStatus, spec: RolloutSpec, ready_canary: int, desired: int, now: datetime.datetime
) -> RolloutStatus:
    """Rolled back when the step's replicas have not served its share within the progress deadline."""
    if old.phase != PROGRESSING or old.step_started_at is not None or old.step_entered_at is None:
        return old
    if (now - old.step_entered_at).total_seconds() < spec.progress_deadline_s:
        return old
    needed = canary_replicas(old, spec.canary_steps, desired)
    return old.model_copy(
        update={
            "phase": ROLLED_BACK,
            "reason": PROGRESS_DEADLINE_EXCEEDED,
            "canary_percent": 0,
            "message": f"revision {old.canary_revision}: {ready_canary}/{needed} replicas ready after "
            f"progress_deadline_s {spec.progress_deadline_s} s; rolled back",
        }
    )


def judged(
    old: RolloutStatus,
    steps: Sequence[CanaryStep],
    failure: str | None,
    step_passed: bool,
    now: datetime.datetime,
) -> RolloutStatus:
    """After a judgement of the step so far: rolled back on a `failure` (what failed, with the
    figures); on to the next step, or to promotion after the last, once `step_passed`."""
    if old.phase not in JUDGED:
        return old
    if failure is not None:
        return old.model_copy(
            update={
                "phase": ROLLED_BACK,
                "reason": ANALYSIS_FAILED,
                "canary_percent": 0,
                "message": f"revision {old.canary_revision}: {failure}",
            }
        )
    if old.phase != PROGRESSING or not step_passed or old.step_started_at is None:
        return old  # a step passes only once its share was carried (and held)
    following = old.step + 1
    if following < len(steps):
        return old.model_copy(
            update={
                "step": following,
                "step_entered_at": stamp(now),
                "step_started_at": None,  # once its replicas carry it (`carried`)
                "message": f"revision {old.canary_revision}: "
                f"{_step_message(steps, following, carried=False)}",
            }
        )
    return old.model_copy(
        update={
            "phase": PROMOTING,
            "message": f"revision {old.canary_revision}: every step passed; "
            "the stable Deployment rolls to it",
        }
    )


def promoted(old: RolloutStatus) -> RolloutStatus:
    """The stable Deployment runs the canary's revision: it is the stable one now, and the canary goes."""
    return RolloutStatus(
        phase=PROMOTED,
        message=f"revision {old.canary_revision}: promoted",
        stable_model=old.canary_model,
        stable_image=old.canary_image,
    )


def step_elapsed(rollout: RolloutStatus, steps: Sequence[CanaryStep], now: datetime.datetime) -> bool:
    """Whether the step's hold has passed (not begun: it has not)."""
    if rollout.step_started_at is None:
        return False
    if rollout.step >= len(steps):
        return True
    return (now - rollout.step_started_at).total_seconds() >= steps[rollout.step].hold_s


def conditions(from_deployment: list[Condition], rollout: RolloutStatus, generation: int) -> list[Condition]:
    """The conditions with a rollout's: Progressing while a canary serves, and RolledBack (True
    with what failed, and the figures, once a revision was rolled back or aborted)."""
    found = {c.type: c for c in from_deployment}
    if rollout.phase in SERVING:
        found["Progressing"] = condition(
            "Progressing", True, "Canary" + rollout.phase, rollout.message, generation
        )
    if rollout.phase == ROLLED_BACK:
        found["RolledBack"] = condition(
            "RolledBack", True, rollout.reason or ANALYSIS_FAILED, rollout.message, generation
        )
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


def announcement(before: RolloutStatus | None, after: RolloutStatus | None) -> tuple[bool, str] | None:
    """(warning, reason) of the event for a rollout that moved to another phase or step, or whose
    step's share was carried; None when it did not move, or ended with no canary left to speak of."""
    if after is None:
        return None
    before = before or RolloutStatus()
    moved = (before.phase, before.step, before.canary_revision, before.canary_percent) != (
        after.phase,
        after.step,
        after.canary_revision,
        after.canary_percent,
    )
    reason = EVENT_REASONS.get(after.phase)
    if not moved or reason is None:
        return None
    return after.phase in (ROLLED_BACK, ABORTED), reason
