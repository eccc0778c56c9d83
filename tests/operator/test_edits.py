"""Every edit reaches the cluster: a manifest edited and applied again with `kubectl apply`, on a real
API server with the operator as the chart runs it.

A field dropped from the spec leaves the children and the status; a model switched from a handler
to a pipeline task and back converges each time; fields another manager set on a child stay,
while the operator's own come back; children an earlier batchd wrote by merge patch lose what the
spec no longer sets; and the same spec gives the same children and status whatever spec came
before it (the property of `test_history.py`, here through `kubectl apply` on the real server).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchd.api.kube_connection import resource_path
from batchd.api.pod import CANARY, child_name, config_map_name
from batchd.api.spec import ModelSpec
from batchd.operator.children import CONFIG_HASH_ANNOTATION
from batchd.operator.kube_requests import FIELD_MANAGER
from batchd.testing.kubernetes.operated import Namespace, Operator
from batchd.testing.manifests import manifest
from batchd.testing.specs import specs
from batchd.testing.waiting import eventually

pytestmark = pytest.mark.slow

HANDLER = {"handler": "batchd.testing.batch_handlers:SlowAdder", "init_kwargs": {"delay_s": 0.1, "scale": 2}}
TASK = {"task": "text-classification", "source": "pvc://weights/classifier"}
SCHEDULING: dict[str, Any] = {
    "nodeSelector": {"gpu": "a100"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
    "env": [{"name": "MODE", "value": "fast"}],
}


def pod_spec(ns: Namespace, name: str) -> dict[str, Any]:
    found: dict[str, Any] = ns.get("deployment", name).get("spec", {}).get("template", {}).get("spec", {})
    return found


def converged(ns: Namespace, name: str) -> dict[str, Any] | None:
    """The resource once the operator has written the status of its current generation."""
    body = ns.bd(name)
    observed = body.get("status", {}).get("observed_generation")
    return body if observed == body.get("metadata", {}).get("generation") else None


def test_a_field_dropped_from_the_manifest_leaves_the_deployment(operator: Operator, ns: Namespace) -> None:
    ns.apply(manifest("edited", HANDLER, **SCHEDULING))
    eventually(lambda: "nodeSelector" in pod_spec(ns, "edited"), what="the Deployment with its scheduling")
    assert pod_spec(ns, "edited")["tolerations"] == SCHEDULING["tolerations"]
    # Another manager's field on the child (kubectl's), and an edit of one of the operator's.
    ns.kubectl("annotate", "deployment/edited", "team.example/owner=search")
    ns.kubectl("label", "deployment/edited", "app.kubernetes.io/managed-by=someone-else", "--overwrite")

    ns.apply(manifest("edited", HANDLER))  # the same file, its scheduling and env removed
    eventually(
        lambda: not {"nodeSelector", "tolerations", "affinity"} & set(pod_spec(ns, "edited")),
        what="nodeSelector, tolerations and affinity to leave the Deployment",
    )
    container = pod_spec(ns, "edited")["containers"][0]
    assert "MODE" not in {variable["name"] for variable in container["env"]}
    deployment = ns.get("deployment", "edited")
    assert deployment["metadata"]["annotations"]["team.example/owner"] == "search"  # theirs stays
    assert deployment["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "batchd"  # ours is back


def test_a_model_switched_between_a_handler_and_a_task_converges_each_time(
    operator: Operator, ns: Namespace
) -> None:
    """With the canary strategy and no node, each new revision waits as a canary for replicas; the
    status holds each revision's model exactly as the spec said it, never a merge of two."""
    dropped = {**HANDLER, "init_kwargs": {"delay_s": 0.1}}  # the `scale` key removed

    def applied(model: dict[str, Any], **spec: Any) -> dict[str, Any]:
        since = operator.requests()
        ns.apply(manifest("switched", model, **spec))
        body: dict[str, Any] = eventually(lambda: converged(ns, "switched"), what=f"the status of {model}")
        assert ns.condition("switched", "Degraded").get("status") == "False", body["status"]["conditions"]
        assert not operator.refused(since, ns.name)
        rollout: dict[str, Any] = body["status"]["rollout"]
        return rollout

    canary = {"strategy": "canary"}
    assert model_of(applied(HANDLER, rollout=canary), "stable_model") == ModelSpec.model_validate(HANDLER)
    to_task = applied(TASK, rollout=canary)
    assert (model_of(to_task, "stable_model"), model_of(to_task, "canary_model")) == (
        ModelSpec.model_validate(HANDLER),
        ModelSpec.model_validate(TASK),
    )
    back = applied(HANDLER, rollout=canary)  # the stable revision again: no canary
    assert "canary_model" not in back and back["phase"] == ""
    eventually(lambda: not ns.get("deployment", child_name("switched", CANARY)), what="the canary to go")
    assert model_of(applied(dropped, rollout=canary), "canary_model") == ModelSpec.model_validate(dropped)
    rolled = applied(dropped)  # rolling: the last model is the stable one, its dropped key gone
    assert model_of(rolled, "stable_model") == ModelSpec.model_validate(dropped)
    assert rolled["stable_model"]["init_kwargs"] == {"delay_s": 0.1} and "canary_model" not in rolled
    eventually(lambda: not ns.get("deployment", child_name("switched", CANARY)), what="the canary to go")


def model_of(rollout: dict[str, Any], section: str) -> ModelSpec:
    return ModelSpec.model_validate(rollout[section])


def test_children_an_earlier_operator_merged_lose_what_the_spec_stops_setting(
    operator: Operator, ns: Namespace
) -> None:
    """batchd once wrote children by merge patch: the API server recorded their fields as an Update
    of the operator's manager, which an apply alone never removes."""
    ns.apply(manifest("upgraded", HANDLER))
    eventually(lambda: ns.get("deployment", "upgraded"), what="the Deployment")
    path = resource_path("apps/v1", "deployments", ns.name, "upgraded")
    earlier = {"User-Agent": f"{FIELD_MANAGER}/0.4.0", "Content-Type": "application/merge-patch+json"}
    patch = {"spec": {"template": {"spec": {"nodeSelector": {"gpu": "old"}}}}}
    response = ns.api.patch(path, content=json.dumps(patch), headers=earlier)
    assert response.is_success, response.text

    def merged_away() -> bool:
        deployment = ns.get("deployment", "upgraded")
        managers = {
            (entry["manager"], entry["operation"]) for entry in deployment["metadata"]["managedFields"]
        }
        return "nodeSelector" not in pod_spec(ns, "upgraded") and (FIELD_MANAGER, "Update") not in managers

    eventually(merged_away, what="the earlier operator's nodeSelector to leave, and its Update entry")


# -- the property, through kubectl apply ------------------------------------------------------------

PAIRS = 24
SERVED_BY_THE_CLUSTER = ("clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy", "internalTrafficPolicy")


def _pair_is_settled_without_pods(pair: tuple[dict[str, Any], dict[str, Any]]) -> bool:
    """A canary of a new revision waits for Ready replicas, which no node gives here: such pairs
    are the pure property's (`test_history.py`), where the rollout settles."""
    first, then = pair
    canary = then.get("rollout", {}).get("strategy") == "canary"
    return not canary or (first["model"], first.get("image")) == (then["model"], then.get("image"))


pairs = st.lists(
    st.tuples(specs, specs).filter(_pair_is_settled_without_pods), min_size=PAIRS, max_size=PAIRS
)


def observed(api: httpx.Client, namespace: str, name: str, autoscaled: bool) -> dict[str, Any]:
    """A resource's children and status as compared: its own name, uids, generations, times,
    what the API server assigns (a Service's address) and the autoscaler's count left out."""
    kinds = {
        "ConfigMap": ("v1", "configmaps", config_map_name(name)),
        "Deployment": ("apps/v1", "deployments", name),
        "Service": ("v1", "services", name),
        "PodDisruptionBudget": ("policy/v1", "poddisruptionbudgets", name),
    }
    found: dict[str, Any] = {}
    for kind, (api_version, plural, child) in kinds.items():
        document = api.get(resource_path(api_version, plural, namespace, child)).json()
        meta = document.get("metadata", {})
        annotations = {
            k: v for k, v in (meta.get("annotations") or {}).items() if k != CONFIG_HASH_ANNOTATION
        }
        body = {key: value for key, value in document.items() if key in ("spec", "data")}
        for field in SERVED_BY_THE_CLUSTER:
            body.get("spec", {}).pop(field, None)
        if kind == "Deployment":
            body["spec"]["template"]["metadata"]["annotations"].pop(CONFIG_HASH_ANNOTATION)
            if autoscaled:
                body["spec"].pop("replicas")
        found[kind] = {"labels": meta.get("labels"), "annotations": annotations, **body}
    status = api.get(
        resource_path("serving.batchd.dev/v1alpha1", "batcheddeployments", namespace, name)
    ).json()["status"]
    status.pop("observed_generation")
    for condition in status["conditions"]:
        condition.pop("lastTransitionTime")
        condition.pop("observedGeneration")
    if autoscaled:
        for count in ("desired_replicas", "replicas", "ready_replicas"):
            status.pop(count, None)
        status["conditions"] = [{k: v for k, v in c.items() if k != "message"} for c in status["conditions"]]
    found["status"] = status
    named: dict[str, Any] = json.loads(json.dumps(found).replace(name, "NAME"))
    return named


@settings(max_examples=1, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(generated=pairs)
def test_the_same_spec_gives_the_same_children_and_status_whatever_was_applied_before(
    operator: Operator, ns: Namespace, generated: list[tuple[dict[str, Any], dict[str, Any]]]
) -> None:
    """PAIRS pairs (A, B): one resource applied with A, then with B once A was converged; another
    with B alone. Each pair's two must have the same children and status."""
    edited = [manifest(edited_name(i), **first) for i, (first, _) in enumerate(generated)]
    ns.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(edited))
    all_converged(ns, edited)
    then = [manifest(edited_name(i), **spec) for i, (_, spec) in enumerate(generated)]
    alone = [manifest(alone_name(i), **spec) for i, (_, spec) in enumerate(generated)]
    ns.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([*then, *alone]))
    all_converged(ns, [*then, *alone])
    for i, (first, spec) in enumerate(generated):
        autoscaled = "autoscaling" in spec
        assert observed(ns.api, ns.name, edited_name(i), autoscaled) == observed(
            ns.api, ns.name, alone_name(i), autoscaled
        ), f"A={first}\nB={spec}"


def all_converged(ns: Namespace, documents: list[dict[str, Any]]) -> None:
    names = [document["metadata"]["name"] for document in documents]
    eventually(
        lambda: all(converged(ns, name) for name in names),
        timeout_s=120,
        what=f"{len(names)} resources converged",
    )


def edited_name(index: int) -> str:
    return f"h{index:02d}e"  # names of one length: neither is a part of another


def alone_name(index: int) -> str:
    return f"h{index:02d}a"
