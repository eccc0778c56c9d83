"""A canary rollout's state: how a new spec, a judgement and a finished promotion move it."""

from __future__ import annotations

import datetime
from typing import Any

from batchd.api.manifest import parse_manifest
from batchd.api.spec import BatchedDeployment
from batchd.operator import rollout
from batchd.operator.rollout import Rollout
from batchd.testing.manifests import manifest

NOW = datetime.datetime(2026, 11, 28, 12, 0, tzinfo=datetime.UTC)
STEPS = [{"traffic_percent": 10, "hold_s": 30}, {"traffic_percent": 50, "hold_s": 30}]


def bd(version: int, **rollout_spec: Any) -> BatchedDeployment:
    model = {"handler": "batchd.testing.batch_handlers:SlowAdder", "init_kwargs": {"delay_s": version / 100}}
    spec = {"strategy": "canary", "steps": STEPS, **rollout_spec}
    return parse_manifest(manifest("adder", model, namespace="ml", rollout=spec))


def started(version: int = 2, **rollout_spec: Any) -> tuple[BatchedDeployment, Rollout]:
    """A rollout of `version` over a stable version 1, as converge plans it."""
    stable = rollout.plan(bd(1), "r1", "r1", Rollout(), NOW)
    new = bd(version, **rollout_spec)
    return new, rollout.plan(new, f"r{version}", "r1", stable, NOW)


def test_a_new_resource_records_its_revision_as_stable_and_rolls_nothing_out() -> None:
    first = rollout.plan(bd(1), "r1", "r1", Rollout(), NOW)
    assert first.phase == rollout.NONE and not first.serving_canary
    assert rollout.stable_of(bd(2), first).spec.model == bd(1).spec.model


def test_a_new_revision_starts_at_the_first_steps_share_beside_the_stable_one() -> None:
    new, plan = started()
    assert (plan.phase, plan.canary_revision, plan.canary_percent) == (rollout.PROGRESSING, "r2", 10)
    assert rollout.stable_of(new, plan).spec.model == bd(1).spec.model  # stable keeps its model
    assert rollout.canary_replicas(plan, desired=4) == 1 and rollout.canary_replicas(plan, 20) == 2


def test_a_passed_step_moves_on_and_the_last_one_promotes() -> None:
    _, plan = started()
    steps = bd(2).spec.rollout.canary_steps
    assert rollout.judged(plan, steps, None, False, NOW) == plan  # not passed yet: stays
    later = NOW + datetime.timedelta(seconds=31)
    second = rollout.judged(plan, steps, None, True, later)
    assert (second.step, second.canary_percent) == (1, 50)
    promoting = rollout.judged(second, steps, None, True, later)
    assert promoting.phase == rollout.PROMOTING and promoting.canary_percent == 50
    done = rollout.promoted(bd(2), promoting)
    assert (done.phase, done.canary_percent) == (rollout.PROMOTED, 0)
    assert rollout.stable_of(bd(2), done).spec.model == bd(2).spec.model


def test_a_failed_judgement_rolls_back_and_the_revision_is_not_tried_again() -> None:
    new, plan = started()
    failed = rollout.judged(plan, new.spec.rollout.canary_steps, "error rate 30%", True, NOW)
    assert (failed.phase, failed.canary_percent) == (rollout.ROLLED_BACK, 0)
    assert "error rate 30%" in failed.message
    assert rollout.canary_replicas(failed, 4) == 0
    assert rollout.plan(new, "r2", "r1", failed, NOW) == failed
    conditions = {c["type"]: c for c in rollout.conditions([], failed, generation=3)}
    assert (
        conditions["RolledBack"]["status"] == "True"
        and "error rate 30%" in conditions["RolledBack"]["message"]
    )
    assert rollout.announcement(plan, failed) == (True, "RolledBack")


def test_a_second_change_during_a_rollout_replaces_the_canary_from_the_first_step() -> None:
    new, plan = started()
    moved = rollout.judged(plan, new.spec.rollout.canary_steps, None, True, NOW)
    third = rollout.plan(bd(3), "r3", "r1", moved, NOW)
    assert (third.canary_revision, third.step, third.canary_percent) == ("r3", 0, 10)
    # Back to the stable revision: no canary any more.
    assert not rollout.plan(bd(1), "r1", "r1", moved, NOW).serving_canary


def test_pause_holds_the_step_abort_sends_everything_back_until_it_is_lifted() -> None:
    _, plan = started()
    paused = rollout.plan(bd(2, paused=True), "r2", "r1", plan, NOW)
    assert paused.phase == rollout.PAUSED and paused.canary_percent == 10
    assert rollout.judged(paused, bd(2).spec.rollout.canary_steps, None, True, NOW) == paused
    resumed = rollout.plan(bd(2), "r2", "r1", paused, NOW)
    assert resumed.phase == rollout.PROGRESSING
    aborted = rollout.plan(bd(2, abort=True), "r2", "r1", resumed, NOW)
    assert (aborted.phase, aborted.canary_percent) == (rollout.ABORTED, 0)
    again = rollout.plan(bd(2), "r2", "r1", aborted, NOW)
    assert (again.phase, again.step, again.canary_percent) == (rollout.PROGRESSING, 0, 10)


def test_the_rolling_strategy_takes_a_new_revision_as_stable_at_once() -> None:
    rolling = parse_manifest(manifest("adder", "examples.adder:BatchAdder.handle_batch"))
    plan = rollout.plan(rolling, "r9", "r1", Rollout(stable_model={"handler": "x:y"}), NOW)
    assert plan.phase == rollout.NONE
    assert rollout.stable_of(rolling, plan).spec.model == rolling.spec.model


def test_the_state_survives_the_status() -> None:
    _, plan = started()
    assert Rollout.from_status({"rollout": plan.to_status()}) == plan
    assert Rollout.from_status({}) == Rollout()


def test_the_first_steps_hold_is_counted_from_when_a_canary_replica_serves() -> None:
    _, plan = started()
    steps = bd(2).spec.rollout.canary_steps
    assert not rollout.step_elapsed(plan, steps, NOW + datetime.timedelta(hours=1))  # still starting
    begun = rollout.serving(plan, NOW + datetime.timedelta(seconds=40))
    assert rollout.serving(begun, NOW + datetime.timedelta(seconds=50)) == begun  # once
    assert not rollout.step_elapsed(begun, steps, NOW + datetime.timedelta(seconds=69))
    assert rollout.step_elapsed(begun, steps, NOW + datetime.timedelta(seconds=70))
