"""History does not matter: the children and status after spec A then spec B are those after B alone.

Pure: the operator's plan, applied to a cluster simulated as Server-Side Apply leaves it (each child
holds exactly what the operator last applied, as it owns every field it sends), the status as the
status writer's patches leave it, and every Deployment rolled out to what it was last given. A
canary rollout is settled first (each step carried and passed), since a rollout in progress is
history by design; so are the three things compared apart: the last rollout's outcome (`Promoted`,
kept in view), when conditions last moved, and the autoscaler's count (decided by load, not by the
spec: B alone starts from the count the edited resource had).
"""

from __future__ import annotations

import copy
import datetime
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from batchd.api.manifest import document
from batchd.api.pod import CANARY, REVISION_LABEL, child_name, config_map_name
from batchd.api.status import BatchedDeploymentStatus, RolloutStatus, read_status
from batchd.operator import children, plan, rollout, status_writer
from batchd.operator.resource import parse
from batchd.operator.settings import Settings
from batchd.testing.specs import specs

NOW = datetime.datetime(2026, 11, 28, 12, 0, tzinfo=datetime.UTC)
SETTINGS = Settings(replica_image="registry.test/replica:default", router_url="http://router.batchd.svc")
Manifest = dict[str, Any]


def patched(stored: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    """A status after the writer's JSON Patch, as the API server applies it (all or nothing)."""
    result = copy.deepcopy(stored)
    for operation in operations:
        path = operation["path"].removeprefix("/status")
        if operation["op"] == "test":
            assert result.get(path.removeprefix("/")) == operation["value"], f"guard failed: {operation}"
        elif path == "" and operation["op"] == "add":
            result = copy.deepcopy(operation["value"])
        elif operation["op"] == "add":
            result[path.removeprefix("/")] = copy.deepcopy(operation["value"])
        elif operation["op"] == "remove":
            del result[path.removeprefix("/")]
        else:
            raise AssertionError(f"unexpected operation {operation}")
    return result


def rolled_out(manifest: Manifest) -> Manifest:
    """A child as the API server answers its apply: a Deployment has rolled out its template."""
    answer = copy.deepcopy(manifest)
    answer["metadata"]["generation"] = 1
    if manifest["kind"] == "Deployment":
        replicas = manifest["spec"]["replicas"]
        answer["status"] = {
            "observedGeneration": 1,
            "replicas": replicas,
            "readyReplicas": replicas,
            "updatedReplicas": replicas,
        }
    return answer


@dataclass
class World:
    """One BatchedDeployment in a simulated cluster, converged after each edit."""

    name: str = "model"
    generation: int = 0
    spec: dict[str, Any] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)
    children: dict[tuple[str, str], Manifest] = field(default_factory=dict)
    clock: datetime.datetime = NOW

    def body(self) -> dict[str, Any]:
        manifest = document(self.name, self.spec, namespace="ml")
        manifest["metadata"].update({"uid": "0d1b2c3a", "generation": self.generation})
        return {**manifest, "status": copy.deepcopy(self.status)}

    def apply(self, spec: dict[str, Any], generation: int | None = None) -> World:
        """`kubectl apply` of `spec`, then converge until the rollout (if any) has settled."""
        self.spec = copy.deepcopy(spec)
        self.generation = generation if generation is not None else self.generation + 1
        self.converge()
        for _ in range(10):
            current = read_status(self.status).rollout
            if current is None or current.phase not in rollout.SERVING:
                return self
            before = copy.deepcopy(self.status)
            self.judge_passing()
            if self.status == before:
                return self  # waiting (for replicas it cannot have)
            self.converge()
        raise AssertionError(f"the rollout did not settle: {self.status.get('rollout')}")

    def converge(self) -> None:
        resource = parse(self.body())
        planned = plan.children_plan(resource, SETTINGS, self.clock)
        answers = {(m["kind"], m["metadata"]["name"]): rolled_out(m) for m in planned.manifests}
        written = plan.status_plan(resource, planned, answers, SETTINGS, self.clock)
        self.children.update(
            {key: copy.deepcopy(m) for key, m in zip(answers, planned.manifests, strict=True)}
        )
        if plan.canary_gone(planned.before, written.rollout or RolloutStatus()):
            for kind in children.CANARY_KINDS:
                name = (
                    config_map_name(self.name, CANARY)
                    if kind == "ConfigMap"
                    else child_name(self.name, CANARY)
                )
                self.children.pop((kind, name), None)
        self.status = patched(self.status, status_writer.operations(self.status, written.status))

    def judge_passing(self) -> None:
        """The judge's moves for a canary whose replicas are all Ready and whose figures pass."""
        resource = parse(self.body())
        current = resource.status.rollout
        assert resource.bd is not None and current is not None
        if current.phase not in rollout.JUDGED:
            return
        steps = resource.bd.spec.rollout.canary_steps
        desired = resource.status.desired_replicas or 0
        ready = rollout.canary_replicas(current, steps, desired)
        after = rollout.carried(current, steps, ready, desired, self.clock)
        self.clock += datetime.timedelta(seconds=max(step.hold_s for step in steps) + 1)
        after = rollout.judged(after, steps, None, True, self.clock)
        update = BatchedDeploymentStatus(rollout=after)
        self.status = patched(self.status, status_writer.operations(self.status, update, ["rollout"]))

    def waiting_at_zero(self) -> bool:
        current = read_status(self.status).rollout
        return current is not None and current.phase in rollout.JUDGED


def observed(world: World) -> tuple[dict[str, Any], dict[str, Any]]:
    """(children, status) as compared: the last rollout's outcome and when conditions moved left out."""
    found = {f"{kind}/{name}": manifest for (kind, name), manifest in world.children.items()}
    stored = copy.deepcopy(world.status)
    for condition in stored.get("conditions", []):
        condition.pop("lastTransitionTime", None)
        if condition["type"] == "RolledBack" and condition["status"] == "False":
            condition.pop("reason")  # the last rollout's outcome, or that there was none
    if stored.get("rollout", {}).get("phase") in (rollout.NONE, rollout.PROMOTED):
        for outcome in ("phase", "message", "reason"):
            stored["rollout"].pop(outcome, None)
    return found, stored


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=specs, then=specs)
def test_the_children_and_status_of_a_spec_do_not_depend_on_the_spec_before_it(
    first: dict[str, Any], then: dict[str, Any]
) -> None:
    edited = World().apply(first).apply(then)
    assume(not edited.waiting_at_zero())  # a canary at zero replicas waits for some: its own test
    # With autoscaling, the count is the autoscaler's (decided by load): B alone starts from it too.
    decided = {"desired_replicas": edited.status["desired_replicas"]} if "autoscaling" in then else {}
    alone = World(status=decided).apply(then, generation=edited.generation)
    assert observed(edited) == observed(alone)


@settings(max_examples=50, deadline=None)
@given(spec=specs)
def test_converging_twice_changes_nothing(spec: dict[str, Any]) -> None:
    world = World().apply(spec)
    before = copy.deepcopy((world.children, world.status))
    world.converge()
    assert (world.children, world.status) == before


@given(spec=specs, dropped=st.sampled_from(["nodeSelector", "tolerations", "affinity", "env", "volumes"]))
@settings(max_examples=50, deadline=None)
def test_a_field_dropped_from_the_spec_leaves_the_deployment(spec: dict[str, Any], dropped: str) -> None:
    with_field = {**spec, "nodeSelector": {"gpu": "a100"}, "tolerations": [{"operator": "Exists"}]}
    with_field.update({"affinity": {"podAffinity": {}}, "env": [{"name": "A", "value": "1"}]})
    with_field.update(
        {"volumes": [{"name": "v", "emptyDir": {}}], "volumeMounts": [{"name": "v", "mountPath": "/v"}]}
    )
    without = {key: value for key, value in with_field.items() if key != dropped}
    if dropped == "volumes":
        without.pop("volumeMounts")
    world = World().apply(with_field).apply(without)
    pod = world.children[("Deployment", "model")]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    if dropped == "env":
        assert "A" not in {item["name"] for item in container["env"]}
    elif dropped == "volumes":
        assert "v" not in {item["name"] for item in pod["volumes"]}
    else:
        assert dropped not in pod


def test_a_canary_at_zero_replicas_waits_with_no_pod_and_no_deadline() -> None:
    canary = {"strategy": "canary", "progress_deadline_s": 60}
    one = {"model": {"handler": "a:B", "init_kwargs": {"v": 1}}, "num_replicas": 0, "rollout": canary}
    two = {**one, "model": {"handler": "a:B", "init_kwargs": {"v": 2}}}
    world = World().apply(one).apply(two)
    current = read_status(world.status).rollout
    assert current is not None and (current.phase, current.step_entered_at) == (rollout.PROGRESSING, None)
    assert world.children[("Deployment", "model-canary")]["spec"]["replicas"] == 0
    stable_labels = world.children[("Deployment", "model")]["spec"]["template"]["metadata"]["labels"]
    assert stable_labels[REVISION_LABEL] == read_status(world.status).revision != current.canary_revision
    # Scaled up an hour later: the canary gets its replica, and its deadline runs from then.
    world.clock += datetime.timedelta(hours=1)
    world.spec, world.generation = {**two, "num_replicas": 2}, world.generation + 1
    world.converge()
    current = read_status(world.status).rollout
    assert current is not None and (current.phase, current.step_entered_at) == (
        rollout.PROGRESSING,
        world.clock,
    )
    assert world.children[("Deployment", "model-canary")]["spec"]["replicas"] == 1
