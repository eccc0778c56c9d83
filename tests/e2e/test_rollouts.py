"""Rollouts end to end on a real cluster: every edit of a manifest, applied with `kubectl apply`,
reaching the replicas as pods of the node while clients send through the chart's router.

What a user who edits and ships a model notices:
- rolling: a model switched from a handler to a pipeline task and back loses no request and ends
  serving the last one; a nodeSelector that made the pods unschedulable, dropped from the file,
  lets them be scheduled again;
- canary (the operator judging each new revision from its replicas' own figures): a revision that
  fails a third of its items, or answers eight times slower, is rolled back on its own, and clients
  saw only the failures of its first step; a good revision is promoted and its canary goes, with no
  request lost, though the operator was replaced mid-rollout; a fix shipped while a bad revision
  takes its first step is promoted on its own answers; a revision whose pods never become Ready is
  rolled back at its progress deadline, losing nothing; a router restarted mid-rollout splits as
  before; a second change mid-rollout replaces the canary with the newest revision; deleting the
  resource mid-rollout takes both revisions away.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from batchd.api.pod import CANARY, REVISION_LABEL, STABLE
from batchd.testing.kubernetes import handlers
from batchd.testing.kubernetes.components import forbidden
from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.kubernetes.node import Node
from batchd.testing.kubernetes.release import ONE_ROUTER, Release, installed, list_objects
from batchd.testing.manifests import manifest, revision
from batchd.testing.models import build_bert
from batchd.testing.pods import is_ready
from batchd.testing.traffic import Outcome, Traffic
from batchd.testing.waiting import NotYet, eventually

pytestmark = pytest.mark.slow

NAME = "shop"  # rolled out by canary
EDITED = "reviews"  # rolled out by rolling update, as most deployments are
START_S = 150.0  # a replica pod starts in seconds; the machine may be busy
# Requests a second through the router, all along each test: well within what a replica serves
# while the other pytest worker takes the machine's other core.
RATE = 20.0
FIRST_SHARE = 20  # percent
ANALYSIS: dict[str, Any] = {"min_requests": 10, "max_error_rate": 0.05, "max_p99_ratio": 1.5, "interval_s": 3}
ROLLOUT: dict[str, Any] = {
    "strategy": "canary",
    "steps": [{"traffic_percent": FIRST_SHARE, "hold_s": 5}, {"traffic_percent": 50, "hold_s": 5}],
    "analysis": ANALYSIS,
}

# One item a batch: an item that fails is its batch, and a slow batch is a slow request.
BATCHING = {"max_batch_size": 1, "batch_wait_timeout_s": 0, "max_queued_requests": 512}
STABLE_DELAY_S = 0.02
# Nothing that changes the pods the operator makes: the chart's operator pod, which takes over
# mid-rollout, must make the same ones.
OPERATOR_ENV = {"BATCHD_REPLICA_POLL_INTERVAL_S": "0.5"}
VALUES = {"router": {**ONE_ROUTER["router"], "hold": {"timeoutSeconds": 120}}}
# What both a text handler and a text-classification pipeline take.
TEXT = b'{"instances": ["this movie was wonderful"]}'
TEXT_TASK = {"task": "text-classification", "source": handlers.model_source()}


def holding_first(hold_s: float) -> dict[str, Any]:
    """The test's rollout, with a first step of `hold_s`."""
    first, *rest = ROLLOUT["steps"]
    return {"steps": [{**first, "hold_s": hold_s}, *rest]}


def text_handler(version: int) -> dict[str, Any]:
    return {"handler": "batchd.testing.batch_handlers:TextLength", "init_kwargs": {"version": version}}


@dataclass(frozen=True)
class Stack:
    release: Release
    operator: contextlib.ExitStack  # the operator as a process of this machine, while it runs

    def hand_over_operator(self) -> None:
        """Stop this machine's operator: the chart's operator pod starts in its place, a new
        process that knows of the rollout only what the status and the labels say."""
        self.operator.close()

    def ship(self, model: dict[str, Any], rollout: dict[str, Any] | None = None, **analysis: Any) -> None:
        """`kubectl apply` of the canary resource with this model (a new revision), `rollout` and
        `analysis` over the test's."""
        rollout = {**ROLLOUT, **(rollout or {}), "analysis": {**ANALYSIS, **analysis}}
        document = manifest(NAME, model, batching=BATCHING, rollout=rollout, **handlers.pod_spec())
        self.release.apply(document)

    def edit(self, model: dict[str, Any], **spec: Any) -> None:
        """`kubectl apply` of the rolled resource's file, as edited: this model, these fields."""
        fields = {**handlers.pod_spec_with_model(), **spec}
        self.release.apply(manifest(EDITED, model, batching=BATCHING, **fields))

    def status(self, name: str = NAME) -> dict[str, Any]:
        found: dict[str, Any] = (self.release.get("bd", name) or {}).get("status") or {}
        return found

    def rollout(self) -> dict[str, Any]:
        found: dict[str, Any] = self.status().get("rollout") or {}
        return found

    def rollout_in(self, *phases: str) -> bool | NotYet:
        """Whether the rollout is in one of `phases`; else what it is, and its pods."""
        return self.rollout().get("phase", "") in phases or NotYet(self.describe())

    def describe(self) -> str:
        """The rollout as the status has it, the replica pods of both tracks (revision, Ready) and
        the operator's pods: what a failed wait on a rollout needs to say."""
        status = self.status()
        rollout = {
            key: value
            for key, value in self.rollout().items()
            if key not in ("stable_model", "canary_model", "stable_image", "canary_image")
        }
        pods = [
            f"{track} {pod['metadata']['labels'].get(REVISION_LABEL)} ready={is_ready(pod)}"
            for track in (STABLE, CANARY)
            for pod in self.release.pods(NAME, track=track)
        ]
        operators = [
            f"{pod['metadata']['name']}:{pod.get('status', {}).get('phase')}"
            for pod in list_objects(self.release.api, "pod", self.release.namespace)
            if pod["metadata"]["name"].startswith(f"{self.release.name}-")
            and "router" not in pod["metadata"]["name"]
        ]
        logs = self.release.cluster.kubectl(
            "logs", "-n", self.release.namespace, f"deployment/{self.release.name}", "--tail=10", check=False
        )
        return (
            f"revision {status.get('revision')}, rollout {rollout}, replica pods {pods}, "
            f"operator pods {operators}; the operator pod's last lines:\n{logs.stdout}{logs.stderr}"
        )

    def serving_last_edit(self) -> bool:
        """Whether the rolled resource serves its spec's revision: converged, rolled out, and
        every pod of its Deployment that runs carries that revision."""
        body = self.release.get("bd", EDITED) or {}
        status = body.get("status") or {}
        if status.get("observed_generation") != body.get("metadata", {}).get("generation"):
            return False
        if self.release.condition(EDITED, "Progressing").get("reason") != "RolloutComplete":
            return False
        pods = self.release.pods(EDITED)
        return bool(pods) and all(
            pod["metadata"]["labels"][REVISION_LABEL] == status["revision"] and is_ready(pod) for pod in pods
        )

    def traffic(self, name: str = NAME, body: bytes = b'{"instances": [1]}') -> Traffic:
        url = self.release.router_url()
        return Traffic(lambda: [url], f"/v1/models/{name}:predict", body, RATE)

    async def while_sending(
        self,
        until: Any,
        what: str,
        timeout_s: float,
        meanwhile: Any = None,
        *,
        name: str = NAME,
        body: bytes = b'{"instances": [1]}',
    ) -> tuple[list[Outcome], float]:
        """Traffic through the router to `name` until `until()` holds (polled), then 5 s more; the
        outcomes, and when (on their clock) `until()` first held. `meanwhile()` runs once the
        traffic has begun."""
        traffic = self.traffic(name, body)
        started = time.perf_counter()
        running = asyncio.create_task(traffic.run(timeout_s + 10, start=started))
        try:
            if meanwhile is not None:
                await asyncio.to_thread(meanwhile)
            await asyncio.to_thread(eventually, until, timeout_s=timeout_s, what=what)
            held_s = time.perf_counter() - started
            await asyncio.sleep(5)  # what clients see after it, too
        finally:
            traffic.stop()
            outcomes = await running
        return outcomes, held_s


@pytest.fixture(scope="module")
def stack(
    control_plane: ControlPlane, kube_node: Node, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    logs = tmp_path_factory.mktemp("rollouts")
    with installed(control_plane, logs, VALUES, wait=True) as release:
        release.apply(handlers.config_map())
        release.apply(handlers.model_config_map(build_bert(logs / "classifier", "classification")))
        with contextlib.ExitStack() as operator:
            operator.enter_context(release.operator(logs / "operator.log", env=OPERATOR_ENV))
            stack = Stack(release, operator)
            stack.ship(revision(1, delay_s=STABLE_DELAY_S))
            eventually(lambda: release.pods(NAME, ready=True), timeout_s=START_S, what="the stable replica")
            yield stack
        # Everything the rollouts asked of the API server, the chart's RBAC allowed.
        assert forbidden(control_plane, release.operator_user) == []
        assert forbidden(control_plane, release.router_user) == []


@pytest.fixture(autouse=True)
def rollout_ended(stack: Stack) -> None:
    """Each test starts once the rollout before it ended: a test that failed mid-rollout leaves
    its own failure, not the next test's."""
    eventually(
        lambda: stack.rollout_in("", "Promoted", "RolledBack", "Aborted"),
        timeout_s=START_S,
        what="the last test's rollout to end",
    )


def statuses(outcomes: list[Outcome]) -> Counter[int | None]:
    return Counter(outcome.status for outcome in outcomes)


@pytest.mark.timeout(4 * START_S)
async def test_a_model_switched_from_a_handler_to_a_task_and_back_loses_nothing_and_serves_the_last(
    stack: Stack,
) -> None:
    stack.edit(text_handler(1))
    eventually(stack.serving_last_edit, timeout_s=START_S, what="the handler serving")
    revisions = [stack.status(EDITED)["revision"]]

    def switch() -> None:
        for model in (TEXT_TASK, text_handler(2)):  # each a `kubectl apply` of the edited file
            stack.edit(model)
            eventually(
                lambda: stack.serving_last_edit() and stack.status(EDITED)["revision"] not in revisions,
                timeout_s=START_S,
                what=f"{model} serving",
            )
            revisions.append(stack.status(EDITED)["revision"])

    outcomes, _ = await stack.while_sending(
        lambda: len(revisions) == 3, "the last model serving", 3 * START_S, switch, name=EDITED, body=TEXT
    )
    assert set(statuses(outcomes)) == {200}, statuses(outcomes)
    status = stack.status(EDITED)
    assert status["rollout"]["stable_model"]["handler"] == text_handler(2)["handler"]
    assert (
        "task" not in status["rollout"]["stable_model"] and "source" not in status["rollout"]["stable_model"]
    )
    assert stack.release.condition(EDITED, "Degraded")["status"] == "False"


@pytest.mark.timeout(3 * START_S)
async def test_a_dropped_node_selector_that_made_the_pods_unschedulable_lets_them_be_scheduled_again(
    stack: Stack,
) -> None:
    nowhere = {"batchd.test/no-such-node": "true"}

    def unschedulable_then_dropped() -> None:
        stack.edit(text_handler(3), nodeSelector=nowhere)

        def pending() -> bool:
            return any(pod.get("status", {}).get("phase") == "Pending" for pod in stack.release.pods(EDITED))

        eventually(pending, timeout_s=START_S, what="a pod no node can take")
        stack.edit(text_handler(3))  # the nodeSelector dropped from the file

    outcomes, _ = await stack.while_sending(
        lambda: stack.serving_last_edit() and "nodeSelector" not in pod_template(stack),
        "the pods scheduled again",
        2 * START_S,
        unschedulable_then_dropped,
        name=EDITED,
        body=TEXT,
    )
    assert set(statuses(outcomes)) == {200}, statuses(outcomes)  # the old pod served meanwhile
    assert all(pod["spec"].get("nodeName") for pod in stack.release.pods(EDITED))


def pod_template(stack: Stack) -> dict[str, Any]:
    found: dict[str, Any] = (stack.release.get("deployment", EDITED) or {})["spec"]["template"]["spec"]
    return found


@pytest.mark.timeout(START_S + 120)
async def test_a_revision_failing_a_third_of_its_items_is_rolled_back_after_its_first_steps_failures(
    stack: Stack,
) -> None:
    stack.ship(revision(2, fail_percent=30, delay_s=STABLE_DELAY_S))
    outcomes, rolled_back_s = await stack.while_sending(
        lambda: stack.rollout_in("RolledBack"), "the rollback", START_S + 60
    )
    failed = [outcome for outcome in outcomes if outcome.status != 200]
    # Only the first step's share of one analysis window can have reached the canary.
    bound = math.ceil(FIRST_SHARE / 100 * RATE * ANALYSIS["interval_s"])
    assert 0 < len(failed) <= bound, (len(failed), bound, statuses(outcomes), stack.rollout())
    # The model raised on each of them alone: the replica says the item failed (422).
    assert {outcome.status for outcome in failed} == {422}
    assert all(outcome.status == 200 for outcome in outcomes if outcome.sent_s > rolled_back_s + 2)
    condition = stack.release.condition(NAME, "RolledBack")
    assert condition["status"] == "True" and "error rate" in condition["message"], condition
    assert stack.release.events("RolledBack")
    canary = stack.release.get("deployment", f"{NAME}-canary")
    assert canary is not None and canary["spec"]["replicas"] == 0


@pytest.mark.timeout(START_S + 120)
async def test_a_revision_eight_times_slower_is_rolled_back(stack: Stack) -> None:
    # Eight times the stable revision's hold: a shared CPU adds its delays to both revisions' alike,
    # which a smaller factor would drown.
    stack.ship(revision(3, delay_s=8 * STABLE_DELAY_S))

    def slow_rolled_back() -> bool | NotYet:
        message = stack.rollout().get("message", "")
        return (stack.rollout_in("RolledBack") and "times the stable revision's" in message) or NotYet(
            stack.describe()
        )

    outcomes, _ = await stack.while_sending(slow_rolled_back, "the slow revision rolled back", START_S + 60)
    assert set(statuses(outcomes)) == {200}, statuses(outcomes)
    condition = stack.release.condition(NAME, "RolledBack")
    assert condition["status"] == "True" and "times the stable revision's" in condition["message"]


@pytest.mark.timeout(3 * START_S + 120)
async def test_a_good_revision_is_promoted_losing_nothing_and_its_canary_goes_across_an_operator_restart(
    stack: Stack,
) -> None:
    stable_before = (stack.release.get("bd", NAME) or {})["status"]["revision"]
    # A p99 ratio a CPU shared with the rest of the suite cannot push a good revision past; a
    # first step that outlasts the hand-over, so that the operator taking over takes the next.
    stack.ship(revision(4, delay_s=STABLE_DELAY_S), rollout=holding_first(10), max_p99_ratio=20)
    steps_seen: list[int] = []

    def restart_in_the_first_step() -> None:
        eventually(
            lambda: (
                stack.rollout().get("step_started_at") and stack.release.pods(NAME, ready=True, track=CANARY)
            ),
            timeout_s=START_S,
            what="the canary serving its first step",
        )
        steps_seen.append(int(stack.rollout()["step"]))
        stack.hand_over_operator()

    outcomes, _ = await stack.while_sending(
        lambda: stack.rollout_in("Promoted"),
        "the promotion",
        3 * START_S,
        meanwhile=restart_in_the_first_step,
    )
    assert steps_seen == [0]
    # The operator that took over took the next step, from the status alone.
    assert any("step 2 of 2" in message for message in stack.release.events("CanaryStep", about=NAME))
    assert set(statuses(outcomes)) == {200}, statuses(outcomes)
    status = (stack.release.get("bd", NAME) or {})["status"]
    assert status["revision"] != stable_before and status["rollout"]["canary_percent"] == 0
    eventually(lambda: stack.release.get("deployment", f"{NAME}-canary") is None, what="the canary gone")
    pods = stack.release.pods(NAME)
    assert pods and {pod["metadata"]["labels"][REVISION_LABEL] for pod in pods} == {status["revision"]}
    assert stack.release.condition(NAME, "RolledBack")["status"] == "False"
    assert stack.release.events("Promoted")


@pytest.mark.timeout(3 * START_S + 120)
async def test_a_fix_shipped_while_a_bad_revision_takes_its_first_step_is_promoted_on_its_own_answers(
    stack: Stack,
) -> None:
    # Judged no sooner than the fix can follow it into its first step.
    stack.ship(revision(7, fail_percent=30, delay_s=STABLE_DELAY_S), interval_s=5)
    fixed: list[str] = []

    def fix_in_the_first_step() -> None:
        eventually(
            lambda: stack.rollout().get("step_started_at") and stack.rollout().get("step") == 0,
            timeout_s=START_S,
            what="the bad revision taking its first step",
        )
        bad = stack.rollout()["canary_revision"]
        stack.ship(revision(8, delay_s=STABLE_DELAY_S), max_p99_ratio=20)
        eventually(lambda: stack.rollout()["canary_revision"] != bad, what="the fix as the canary")
        fixed.append(stack.rollout()["canary_revision"])

    outcomes, _ = await stack.while_sending(
        lambda: stack.rollout_in("Promoted"),
        "the fix promoted",
        3 * START_S,
        meanwhile=fix_in_the_first_step,
    )
    # The bad revision's failures (its first step's share, until the fix replaced it) were not
    # counted against the fix: its pods carry another revision.
    assert stack.status()["revision"] == fixed[0], stack.describe()
    assert stack.release.condition(NAME, "RolledBack")["status"] == "False"
    assert {outcome.status for outcome in outcomes} <= {200, 422}, statuses(outcomes)


@pytest.mark.timeout(2 * START_S)
async def test_a_canary_that_never_becomes_ready_is_rolled_back_at_its_progress_deadline_losing_nothing(
    stack: Stack,
) -> None:
    never_ready = {"handler": "batchd.testing.batch_handlers:NoSuchHandler", "init_kwargs": {"version": 9}}
    stack.ship(never_ready, rollout={"progress_deadline_s": 30})
    outcomes, _ = await stack.while_sending(
        lambda: stack.rollout_in("RolledBack"), "the deadline's rollback", START_S
    )
    assert set(statuses(outcomes)) == {200}, statuses(outcomes)
    condition = stack.release.condition(NAME, "RolledBack")
    assert (
        condition["reason"] == "ProgressDeadlineExceeded" and "progress_deadline_s 30" in condition["message"]
    )
    assert any("progress_deadline_s" in message for message in stack.release.events("RolledBack", about=NAME))
    canary = stack.release.get("deployment", f"{NAME}-canary")
    assert canary is not None and canary["spec"]["replicas"] == 0


async def test_mid_rollout_a_restarted_router_splits_a_second_change_replaces_the_canary_a_delete_takes_both(
    stack: Stack,
) -> None:
    release = stack.release
    # A first step that outlasts the router's restart and the second change: all of it mid-rollout.
    stack.ship(revision(5, delay_s=STABLE_DELAY_S), rollout=holding_first(120))
    eventually(
        lambda: stack.rollout().get("step_started_at") and release.pods(NAME, ready=True, track=CANARY),
        timeout_s=START_S,
        what="the canary serving its first step",
    )
    router = f"deployment/{release.name}-router"
    release.cluster.kubectl("rollout", "restart", "-n", release.namespace, router)
    release.cluster.kubectl("rollout", "status", "-n", release.namespace, router, "--timeout=120s")

    def canary_requests() -> float:
        # The new router's own count: it read the share from the status, not from its predecessor.
        text = httpx.get(f"{release.router_admin_url()}/metrics").text
        found = re.search(r'batchd_router_revision_requests_total\{[^}]*track="canary"[^}]*\} (\S+)', text)
        return float(found.group(1)) if found else 0.0

    outcomes, _ = await stack.while_sending(lambda: canary_requests() >= 10, "requests to the canary", 60)
    assert Counter(outcome.status for outcome in outcomes)[200] > 0

    # A second change mid-rollout replaces the canary with the newest revision, from the first step.
    first = stack.rollout()["canary_revision"]
    stack.ship(revision(6, delay_s=STABLE_DELAY_S))

    def newest_canary_serving() -> bool:
        rollout = stack.rollout()
        pods = release.pods(NAME, ready=True, track=CANARY)
        return (
            rollout["canary_revision"] != first
            and rollout["step"] == 0
            and bool(pods)
            and all(pod["metadata"]["labels"][REVISION_LABEL] == rollout["canary_revision"] for pod in pods)
        )

    eventually(newest_canary_serving, timeout_s=START_S, what="the newest revision as the canary")
    release.cluster.kubectl("delete", "-n", release.namespace, f"bd/{NAME}")
    for deployment in (NAME, f"{NAME}-canary"):
        eventually(lambda: release.get("deployment", deployment) is None, what=f"{deployment} gone")  # noqa: B023
