"""What the watches feed in: model names to deployments, EndpointSlices to ready replicas."""

from __future__ import annotations

import time
from typing import Any

import pytest

from batchd.api.pod import CANARY, SERVICE_NAME_LABEL, labels
from batchd.api.priority import PriorityClass, UnknownPriorityClass, asked_class, named_in_headers
from batchd.router.app import DirectoryEvents
from batchd.router.client_deadline import answer_bound_s
from batchd.router.directory import (
    DeploymentRecord,
    DeploymentRef,
    Directory,
    ready_replicas,
)
from batchd.router.errors import AmbiguousModel, UnknownModel
from batchd.router.holding import Holds
from batchd.router.metrics import RouterMetrics
from batchd.router.prefixes import PrefixIndex
from batchd.router.settings import RouterSettings


def bd(name: str, model: str | None = None, namespace: str = "default") -> dict[str, Any]:
    spec: dict[str, Any] = {"model": {"handler": "examples.adder:BatchAdder.handle_batch"}}
    if model:
        spec["model"]["name"] = model
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec}


def endpoint_slice(
    service: str, endpoints: list[tuple[str, bool | None]], port: int = 8000, name: str = ""
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name or f"{service}-x",
            "namespace": "default",
            # As the EndpointSlice controller copies them from the operator's Service.
            "labels": {**labels(service), SERVICE_NAME_LABEL: service},
        },
        "addressType": "IPv4",
        "ports": [{"name": "metrics", "port": 9090}, {"name": "http", "port": port}],
        "endpoints": [
            {"addresses": [address], "conditions": {} if ready is None else {"ready": ready}}
            for address, ready in endpoints
        ],
    }


class Seen:
    def __init__(self) -> None:
        self.changes: list[tuple[str, tuple[str, ...]]] = []
        self.deleted: list[tuple[str, str]] = []

    def replicas_changed(self, ref: DeploymentRef, replicas: tuple[str, ...]) -> None:
        self.changes.append((str(ref), replicas))

    def deployment_deleted(self, ref: DeploymentRef, model: str) -> None:
        self.deleted.append((str(ref), model))


def test_the_model_name_defaults_to_the_deployments_name() -> None:
    directory = Directory()
    directory.put_deployment(bd("adder"))
    directory.put_deployment(bd("embedder", model="minilm"))
    assert directory.resolve("adder") == DeploymentRef("default", "adder")
    assert directory.resolve("minilm") == DeploymentRef("default", "embedder")
    with pytest.raises(UnknownModel, match="'embedder'"):
        directory.resolve("embedder")


def test_a_model_served_twice_is_refused_naming_both_deployments() -> None:
    directory = Directory()
    directory.put_deployment(bd("a", model="same"))
    directory.put_deployment(bd("b", model="same", namespace="other"))
    with pytest.raises(AmbiguousModel, match="default/a, other/b"):
        directory.resolve("same")


def test_renaming_the_model_moves_it() -> None:
    directory = Directory()
    directory.put_deployment(bd("a", model="old"))
    directory.put_deployment(bd("a", model="new"))
    assert directory.resolve("new") == DeploymentRef("default", "a")
    with pytest.raises(UnknownModel):
        directory.resolve("old")


def test_openai_clients_reach_a_deployment_by_its_served_model_name_too() -> None:
    directory, seen = Directory(), Seen()
    directory.listener = seen
    served = bd("gpt", model="gpt2")
    served["spec"]["model"]["served_model_name"] = "openai-community/gpt2"
    directory.put_deployment(served)
    ref = DeploymentRef("default", "gpt")
    assert directory.resolve("openai-community/gpt2") == ref and directory.resolve("gpt2") == ref
    del served["spec"]["model"]["served_model_name"]
    directory.put_deployment(served)  # the name taken back: it no longer reaches the deployment
    with pytest.raises(UnknownModel, match="openai-community/gpt2"):
        directory.resolve("openai-community/gpt2")
    directory.delete_deployment(served)
    with pytest.raises(UnknownModel):
        directory.resolve("gpt2")
    assert seen.deleted == [("default/gpt", "gpt2")]


def test_only_ready_endpoints_on_the_http_port_are_replicas() -> None:
    found = ready_replicas(
        endpoint_slice("adder", [("10.0.0.1", True), ("10.0.0.2", False), ("10.0.0.3", None)])
    )
    assert found == ("10.0.0.1:8000", "10.0.0.3:8000")
    assert (
        ready_replicas({"ports": [{"name": "other", "port": 1}], "endpoints": [{"addresses": ["1.2.3.4"]}]})
        == ()
    )
    ipv6 = {**endpoint_slice("adder", [("fd00::1", True)]), "addressType": "IPv6"}
    assert ready_replicas(ipv6) == ("[fd00::1]:8000",)


def test_replicas_are_the_union_of_a_services_slices_and_changes_are_told() -> None:
    seen = Seen()
    directory = Directory(seen)
    ref = DeploymentRef("default", "adder")
    directory.put_slice(endpoint_slice("adder", [("10.0.0.1", True)], name="s1"))
    directory.put_slice(endpoint_slice("adder", [("10.0.0.2", True)], port=8001, name="s2"))
    assert directory.replicas(ref) == ("10.0.0.1:8000", "10.0.0.2:8001")
    directory.delete_slice(endpoint_slice("adder", [], name="s1"))
    assert directory.replicas(ref) == ("10.0.0.2:8001",)
    directory.put_slice(endpoint_slice("adder", [("10.0.0.2", True)], port=8001, name="s2"))  # no change
    assert seen.changes == [
        ("default/adder", ("10.0.0.1:8000",)),
        ("default/adder", ("10.0.0.1:8000", "10.0.0.2:8001")),
        ("default/adder", ("10.0.0.2:8001",)),
    ]


def test_a_fresh_list_forgets_what_was_deleted_meanwhile_in_its_namespace_only() -> None:
    seen = Seen()
    directory = Directory(seen)
    directory.put_deployment(bd("gone"))
    directory.put_deployment(bd("elsewhere", namespace="other"))
    directory.put_slice(endpoint_slice("gone", [("10.0.0.1", True)]))
    directory.replace_deployments([bd("kept")], "default")
    directory.replace_slices([], "default")
    assert seen.deleted == [("default/gone", "gone")]
    assert directory.resolve("elsewhere") == DeploymentRef("other", "elsewhere")
    assert directory.replicas(DeploymentRef("default", "gone")) == ()


def test_a_replica_that_leaves_has_its_idle_connections_closed_and_its_prefixes_forgotten() -> None:
    class Pool:
        def __init__(self) -> None:
            self.forgotten: list[str] = []

        def forget(self, replica: str) -> None:
            self.forgotten.append(replica)

    pool = Pool()
    prefixes = PrefixIndex(chunks_per_replica=8)
    prefixes.record("10.0.0.1:8000", (1, 2, 3))
    events = DirectoryEvents(Holds(1, RouterMetrics()), RouterMetrics(), pool, prefixes)  # type: ignore[arg-type]
    directory = Directory(events)
    directory.put_slice(endpoint_slice("adder", [("10.0.0.1", True), ("10.0.0.2", True)]))
    directory.put_slice(endpoint_slice("adder", [("10.0.0.2", True)]))
    assert pool.forgotten == ["10.0.0.1:8000"]
    assert prefixes.chunks("10.0.0.1:8000") == 0


def test_a_deployments_request_timeout_is_read_from_its_spec_or_the_specs_default() -> None:
    directory = Directory()
    quick = bd("quick")
    quick["spec"]["batching"] = {"request_timeout_s": 2.5}
    directory.put_deployment(quick)
    directory.put_deployment(bd("plain"))
    assert directory.request_timeout_s(DeploymentRef("default", "quick")) == 2.5
    assert directory.request_timeout_s(DeploymentRef("default", "plain")) == 30.0  # the spec's default
    assert DeploymentRecord.of(bd("plain")).request_timeout_s == 30.0


def test_a_replicas_answer_is_waited_for_request_timeout_and_a_margin_or_the_time_left() -> None:
    settings = RouterSettings(answer_margin_s=1.0)
    assert answer_bound_s(30.0, settings, None) == 31.0
    assert answer_bound_s(30.0, settings, time.monotonic() + 5) == pytest.approx(5, abs=0.5)
    assert answer_bound_s(30.0, settings, time.monotonic() - 1) == 0.0


def test_a_deployments_priority_classes_are_read_as_its_replicas_read_them() -> None:
    directory = Directory()
    search = bd("search")
    search["spec"]["batching"] = {
        "max_batch_size": 8,
        "priority_classes": [
            {"name": "batch", "priority": -5},
            {"name": "page", "priority": 10, "queue_timeout_s": 0.5},
            {"name": "feed", "priority": 10},
        ],
        "default_priority_class": "batch",
    }
    directory.put_deployment(search)
    directory.put_deployment(bd("plain"))
    classes = directory.classes(DeploymentRef("default", "search"))
    assert classes.names == ["page", "feed", "batch"]  # highest first, equals as the spec gives them
    assert classes.default == PriorityClass("batch", -5)
    assert asked_class(classes, b"Page", b"tenant-a") == (PriorityClass("page", 10, 0.5), "tenant-a")
    assert asked_class(classes, None) == (PriorityClass("batch", -5), "")
    with pytest.raises(UnknownPriorityClass, match=r"expected one of page, feed, batch, got 'nightly'$"):
        asked_class(classes, "nightly")
    plain = directory.classes(DeploymentRef("default", "plain"))
    assert plain.names == ["default"] and directory.classes(DeploymentRef("default", "gone")) == plain
    assert named_in_headers([(b"Batchd-Priority", b"page"), (b"batchd-timeout-s", b"3")]) == (
        b"page",
        None,
        False,
    )


def test_a_canarys_replicas_are_known_apart_with_the_share_the_operator_gives_them() -> None:
    seen = Seen()
    directory = Directory(seen)
    ref = DeploymentRef("default", "adder")
    rolling = {**bd("adder"), "status": {"rollout": {"phase": "Progressing", "canary_percent": 10}}}
    directory.put_deployment(rolling)
    directory.put_slice(endpoint_slice("adder", [("10.0.0.1", True)]))
    canary_slice = endpoint_slice("adder-canary", [("10.0.0.9", True)])
    canary_slice["metadata"]["labels"].update(labels("adder", CANARY))
    directory.put_slice(canary_slice)
    assert directory.replicas(ref) == ("10.0.0.1:8000",)
    assert directory.canary(ref) == (("10.0.0.9:8000",), 10)
    assert directory.all_replicas() == {"10.0.0.1:8000": ref, "10.0.0.9:8000": ref}
    assert seen.changes == [("default/adder", ("10.0.0.1:8000",))]  # only the stable one wakes holds
    # Rolled back: the operator sets the share to 0; the canary's replicas take nothing.
    directory.put_deployment(
        {**bd("adder"), "status": {"rollout": {"phase": "RolledBack", "canary_percent": 0}}}
    )
    assert directory.canary(ref) == (("10.0.0.9:8000",), 0)
    directory.delete_slice(canary_slice)
    directory.put_deployment(rolling)
    assert directory.canary(ref) == ((), 0)


def test_one_record_per_deployment_reads_what_this_version_knows_of_the_spec() -> None:
    """A newer CRD's fields, or a rule only the operator checks, never lose the deployment its
    routes: the router reads what it knows and routes on."""
    newer = bd("chat", model="chat")
    newer["spec"]["model"]["served_model_name"] = "org/chat"
    newer["spec"]["model"]["quantization"] = "int4"  # a field of a later version
    newer["spec"]["batching"] = {
        "request_timeout_s": 5,
        "kv_cache": {"blocks": 10},
        "priority_classes": [{"name": "page", "priority": 10, "weight": 3}, {"name": "bulk", "priority": -1}],
        "default_priority_class": "bulk",
    }
    newer["spec"]["model"]["calls"] = {"helper": "other"}
    newer["spec"]["model"]["init_kwargs"] = {"helper": 1}  # refused by the operator (Degraded)
    newer["status"] = {"rollout": {"phase": "Progressing", "canary_percent": 20, "step_started_at": ""}}
    record = DeploymentRecord.of(newer)
    assert (record.model, record.names, record.request_timeout_s, record.canary_percent) == (
        "chat",
        frozenset({"chat", "org/chat"}),
        5.0,
        20,
    )
    assert (record.classes.names, record.classes.default.name) == (["page", "bulk"], "bulk")


def test_classes_that_break_a_rule_together_name_none_and_the_deployment_still_routes() -> None:
    directory = Directory()
    broken = bd("chat")
    broken["spec"]["batching"] = {
        "request_timeout_s": 5,
        "priority_classes": [{"name": "page", "priority": 10}],
        "default_priority_class": "nightly",  # none of its classes: the operator reports Degraded
    }
    directory.put_deployment(broken)
    ref = directory.resolve("chat")
    assert directory.classes(ref).names == ["default"] and directory.request_timeout_s(ref) == 5.0


def test_a_record_says_whether_its_replicas_cache_prefixes_and_whose() -> None:
    generator = {"task": "text-generation", "source": "file:///models/gpt2"}
    cached = DeploymentRecord.of(
        {**bd("chat"), "spec": {"model": generator, "batching": {"max_batch_size": 16}}}
    )
    assert (cached.prefix_cached, cached.prefix_by_caller, cached.max_batch_size) == (True, True, 16)
    shared = {**generator, "generation": {"prefix_cache_scope": "deployment"}}
    assert not DeploymentRecord.of({**bd("chat"), "spec": {"model": shared}}).prefix_by_caller
    for model in (
        {**generator, "generation": {"prefix_cache_bytes": 0}},
        {**generator, "generation": {"scheduling": "request"}},
        {"handler": "examples.adder:BatchAdder.handle_batch"},
    ):
        assert not DeploymentRecord.of({**bd("chat"), "spec": {"model": model}}).prefix_cached
