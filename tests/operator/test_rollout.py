"""A canary rollout's state: how a new spec, the canary's replicas, a judgement and a finished
promotion move it."""

from __future__ import annotations

import datetime
from typing import Any

from batchd.api.manifest import parse_manifest
from batchd.api.spec import BatchedDeployment
from batchd.api.status import RolloutStatus
from batchd.operator import rollout
from batchd.testing.manifests import manifest

NOW = datetime.datetime(2026, 11, 28, 12, 0, tzinfo=datetime.UTC)
STEPS = [{"traffic_percent": 10, "hold_s": 30}, {"traffic_percent": 50, "hold_s": 30}]


def bd(version: int, **rollout_spec: Any) -> BatchedDeployment:
    model = {"handler": "batchd.testing.batch_handlers:SlowAdder", "init_kwargs": {"delay_s": version / 100}}
    spec = {"strategy": "canary", "steps": STEPS, **rollout_spec}
    return parse_manifest(manifest("adder", model, namespace="ml", rollout=spec))


def at(seconds: float) -> datetime.datetime:
    return NOW + datetime.timedelta(seconds=seconds)


def started(version: int = 2, **rollout_spec: Any) -> tuple[BatchedDeployment, RolloutStatus]:
    """A rollout of `version` over a stable version 1, as converge plans it."""
    stable = rollout.plan(bd(1), "r1", "r1", None, NOW)
    new = bd(version, **rollout_spec)
    return new, rollout.plan(new, f"r{version}", "r1", stable, NOW)


def carried(version: int = 2) -> tuple[BatchedDeployment, RolloutStatus]:
    """The first step's share carried by the canary's one Ready replica (of 4 deployment replicas)."""
    new, plan = started(version)
    return new, rollout.carried(plan, new.spec.rollout.canary_steps, ready_canary=1, desired=4, now=at(5))


def test_a_new_resource_records_its_revision_as_stable_and_rolls_nothing_out() -> None:
    first = rollout.plan(bd(1), "r1", "r1", None, NOW)
    assert first.phase == rollout.NONE and first.phase not in rollout.SERVING
    assert rollout.stable_of(bd(2), first).spec.model == bd(1).spec.model


def test_a_new_revision_gets_its_replicas_before_its_share() -> None:
    new, plan = started()
    steps = new.spec.rollout.canary_steps
    assert (plan.phase, plan.canary_revision, plan.canary_percent) == (rollout.PROGRESSING, "r2", 0)
    assert rollout.stable_of(new, plan).spec.model == bd(1).spec.model  # stable keeps its model
    assert rollout.canary_of(bd(1), plan).spec.model == new.spec.model  # the canary's is in the status
    assert (
        rollout.canary_replicas(plan, steps, desired=4) == 1 and rollout.canary_replicas(plan, steps, 20) == 2
    )
    # No Ready replica yet: no share, and no hold counted.
    assert rollout.carried(plan, steps, ready_canary=0, desired=4, now=at(5)) == plan
    _, going = carried()
    assert (going.canary_percent, going.step_started_at) == (10, at(5))


def test_no_canary_pod_at_zero_replicas() -> None:
    new, plan = started()
    assert rollout.canary_replicas(plan, new.spec.rollout.canary_steps, desired=0) == 0
    assert rollout.carried(plan, new.spec.rollout.canary_steps, ready_canary=0, desired=0, now=at(5)) == plan


def test_a_passed_step_raises_the_share_only_once_its_replicas_are_ready() -> None:
    new, plan = carried()
    steps = new.spec.rollout.canary_steps
    assert rollout.judged(plan, steps, None, False, at(10)) == plan  # not passed yet: stays
    second = rollout.judged(plan, steps, None, True, at(40))
    # Step 2 wants 2 of 4 replicas; until they are Ready the router keeps step 1's share.
    assert (second.step, second.canary_percent, second.step_started_at) == (1, 10, None)
    assert rollout.canary_replicas(second, steps, desired=4) == 2
    assert rollout.carried(second, steps, ready_canary=1, desired=4, now=at(45)) == second
    raised = rollout.carried(second, steps, ready_canary=2, desired=4, now=at(50))
    assert (raised.canary_percent, raised.step_started_at) == (50, at(50))
    promoting = rollout.judged(raised, steps, None, True, at(90))
    assert promoting.phase == rollout.PROMOTING and promoting.canary_percent == 50
    done = rollout.promoted(promoting)
    assert (done.phase, done.canary_percent) == (rollout.PROMOTED, 0)
    assert rollout.stable_of(bd(1), done).spec.model == new.spec.model  # from the status, not the spec


def test_a_failed_judgement_rolls_back_and_the_revision_is_not_tried_again() -> None:
    new, plan = carried()
    steps = new.spec.rollout.canary_steps
    failed = rollout.judged(plan, steps, "error rate 30%", True, NOW)
    assert (failed.phase, failed.reason, failed.canary_percent) == (rollout.ROLLED_BACK, "AnalysisFailed", 0)
    assert "error rate 30%" in failed.message
    assert rollout.canary_replicas(failed, steps, 4) == 0
    assert rollout.plan(new, "r2", "r1", failed, NOW) == failed
    conditions = {c.type: c for c in rollout.conditions([], failed, generation=3)}
    assert conditions["RolledBack"].holds and "error rate 30%" in conditions["RolledBack"].message
    assert rollout.announcement(plan, failed) == (True, "RolledBack")


def test_a_canary_that_never_serves_is_rolled_back_at_its_deadline() -> None:
    new, plan = started(progress_deadline_s=120)
    spec = new.spec.rollout
    assert rollout.past_deadline(plan, spec, ready_canary=0, desired=4, now=at(119)) == plan
    gone = rollout.past_deadline(plan, spec, ready_canary=0, desired=4, now=at(120))
    assert (gone.phase, gone.reason, gone.canary_percent) == (
        rollout.ROLLED_BACK,
        "ProgressDeadlineExceeded",
        0,
    )
    assert "0/1 replicas ready after progress_deadline_s 120 s" in gone.message
    conditions = {c.type: c for c in rollout.conditions([], gone, generation=3)}
    assert conditions["RolledBack"].reason == "ProgressDeadlineExceeded"
    # A step that was carried in time is past no deadline.
    _, going = carried()
    assert rollout.past_deadline(going, spec, ready_canary=1, desired=4, now=at(10_000)) == going


def test_a_second_change_during_a_rollout_replaces_the_canary_from_the_first_step() -> None:
    new, plan = carried()
    moved = rollout.judged(plan, new.spec.rollout.canary_steps, None, True, at(40))
    third = rollout.plan(bd(3), "r3", "r1", moved, NOW)
    assert (third.canary_revision, third.step, third.canary_percent) == ("r3", 0, 0)
    assert third.canary_model == bd(3).spec.model and third.stable_model == bd(1).spec.model
    # Back to the stable revision: no canary any more.
    assert rollout.plan(bd(1), "r1", "r1", moved, NOW).phase not in rollout.SERVING


def test_a_change_during_a_promotion_waits_and_never_reaches_the_stable_revision_unjudged() -> None:
    new, plan = carried()
    steps = new.spec.rollout.canary_steps
    second = rollout.carried(rollout.judged(plan, steps, None, True, at(40)), steps, 2, 4, at(50))
    promoting = rollout.judged(second, steps, None, True, at(90))
    during = rollout.plan(bd(3), "r3", "r1", promoting, at(95))
    assert during == promoting  # the promotion of r2 goes on, from the status
    assert rollout.canary_of(bd(3), during).spec.model == new.spec.model
    done = rollout.promoted(during)
    after = rollout.plan(bd(3), "r3", "r2", done, at(100))
    assert (after.phase, after.canary_revision, after.stable_model) == (
        rollout.PROGRESSING,
        "r3",
        new.spec.model,
    )


def test_abort_is_honoured_while_promoting() -> None:
    new, plan = carried()
    steps = new.spec.rollout.canary_steps
    second = rollout.carried(rollout.judged(plan, steps, None, True, at(40)), steps, 2, 4, at(50))
    promoting = rollout.judged(second, steps, None, True, at(90))
    aborted = rollout.plan(bd(2, abort=True), "r2", "r1", promoting, at(95))
    assert (aborted.phase, aborted.canary_percent) == (rollout.ABORTED, 0)
    assert rollout.stable_of(bd(2), aborted).spec.model == bd(1).spec.model  # stable rolls back


def test_pause_holds_the_step_abort_sends_everything_back_until_it_is_lifted() -> None:
    _, plan = carried()
    paused = rollout.plan(bd(2, paused=True), "r2", "r1", plan, NOW)
    assert paused.phase == rollout.PAUSED and paused.canary_percent == 10
    assert rollout.judged(paused, bd(2).spec.rollout.canary_steps, None, True, NOW) == paused
    resumed = rollout.plan(bd(2), "r2", "r1", paused, NOW)
    assert resumed.phase == rollout.PROGRESSING
    aborted = rollout.plan(bd(2, abort=True), "r2", "r1", resumed, NOW)
    assert (aborted.phase, aborted.canary_percent) == (rollout.ABORTED, 0)
    again = rollout.plan(bd(2), "r2", "r1", aborted, NOW)
    assert (again.phase, again.step, again.canary_percent) == (rollout.PROGRESSING, 0, 0)


def test_the_rolling_strategy_takes_a_new_revision_as_stable_at_once() -> None:
    rolling = parse_manifest(manifest("adder", "examples.adder:BatchAdder.handle_batch"))
    before = RolloutStatus(stable_model=bd(1).spec.model)
    plan = rollout.plan(rolling, "r9", "r1", before, NOW)
    assert plan.phase == rollout.NONE
    assert rollout.stable_of(rolling, plan).spec.model == rolling.spec.model


def test_the_state_survives_the_status() -> None:
    _, plan = carried()
    stored = plan.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert RolloutStatus.model_validate(stored) == plan


def test_a_steps_hold_is_counted_from_when_its_share_is_carried() -> None:
    new, plan = started()
    steps = new.spec.rollout.canary_steps
    assert not rollout.step_elapsed(plan, steps, at(3600))  # still starting
    begun = rollout.carried(plan, steps, ready_canary=1, desired=4, now=at(40))
    assert rollout.carried(begun, steps, ready_canary=1, desired=4, now=at(50)) == begun  # once
    assert not rollout.step_elapsed(begun, steps, at(69))
    assert rollout.step_elapsed(begun, steps, at(70))
