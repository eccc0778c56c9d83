"""Rules on spec fields that the model (`batchd serve`, the operator) and the CRD (`kubectl apply`)
enforce alike: Ray Serve's batching_config names refused with ours to use, `allow_small_batch`
against the queue, and what `model.calls` may name."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from batchd.api.manifest import ManifestError, parse_manifest
from batchd.api.spec import RAY_SERVE_NAMES
from batchd.testing import ROOT
from batchd.testing.kubernetes.admission import admit
from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.manifests import manifest

GOOD: dict[str, Any] = manifest("good")


def with_spec(**spec: Any) -> dict[str, Any]:
    document = copy.deepcopy(GOOD)
    document["spec"].update(spec)
    return document


def refusals(cluster: ControlPlane, namespace: str, document: dict[str, Any]) -> tuple[str, str]:
    """What the API server says (kubectl's refusal) and what the model says (the error text)."""
    admission = admit(cluster, namespace, document)
    assert not admission.admitted, "the API server admitted a manifest the model refuses"
    with pytest.raises(ManifestError) as refused:
        parse_manifest(document)
    return admission.refusal, str(refused.value)


SEED_CASES = [
    ("timeout_s", with_spec(batching={"max_batch_size": 32, "timeout_s": 0.1}), "batch_wait_timeout_s"),
    ("stride_s", with_spec(batching={"stride_s": 0}), "remove it"),
    ("batching_config", with_spec(batching_config={"max_batch_size": 32}), "spec.batching"),
]


@pytest.mark.parametrize(("name", "document", "ours"), SEED_CASES, ids=[case[0] for case in SEED_CASES])
def test_ray_serve_names_are_refused_saying_which_field_to_use(
    control_plane: ControlPlane, module_namespace: str, name: str, document: Any, ours: str
) -> None:
    refusal, message = refusals(control_plane, module_namespace, document)
    field = f"spec.{name}" if name == "batching_config" else f"spec.batching.{name}"
    assert field in refusal and ours in refusal, refusal
    assert f"  {field}: " in message and ours in message, message
    assert "(got " in message  # and the value they wrote


def test_the_readme_maps_every_ray_serve_name_to_ours() -> None:
    readme = (ROOT / "README.md").read_text()
    for _, name in RAY_SERVE_NAMES:
        assert f"| `{name}` |" in readme, name
    assert "| `allow_small_batch` |" in readme and "| `max_batch_size` |" in readme


def test_allow_small_batch_defaults_to_true_and_false_needs_room_for_a_full_batch(
    control_plane: ControlPlane, module_namespace: str
) -> None:
    assert parse_manifest(GOOD).spec.batching.allow_small_batch is True
    stored = admit(control_plane, module_namespace, GOOD).stored
    assert stored["spec"]["batching"]["allow_small_batch"] is True
    fits = with_spec(batching={"allow_small_batch": False, "max_batch_size": 8, "max_queued_requests": 8})
    assert admit(control_plane, module_namespace, fits).admitted
    assert parse_manifest(fits).spec.batching.allow_small_batch is False

    cramped = with_spec(batching={"allow_small_batch": False, "max_batch_size": 8, "max_queued_requests": 4})
    refusal, message = refusals(control_plane, module_namespace, cramped)
    assert "spec.batching.max_queued_requests" in refusal, refusal
    assert "max_queued_requests (4) of at least max_batch_size (8)" in message


def test_calls_name_deployments_for_a_handler_class(
    control_plane: ControlPlane, module_namespace: str
) -> None:
    composer = manifest(
        "composer", {"handler": "examples.classifier:EmbeddingClassifier", "calls": {"e": "minilm"}}
    )
    admission = admit(control_plane, module_namespace, composer)
    assert admission.admitted, admission.refusal
    assert parse_manifest(composer).spec.model.calls == {"e": "minilm"}


CALLS_CASES = [
    (
        "a task calls nothing",
        {"task": "fill-mask", "source": "hf://a/b", "calls": {"e": "minilm"}},
        "model.handler",
    ),
    ("deployment name", {"handler": "m:C", "calls": {"e": "MiniLM"}}, "spec.model.calls.e"),
]


@pytest.mark.parametrize(("case", "model", "says"), CALLS_CASES, ids=[case[0] for case in CALLS_CASES])
def test_bad_calls_are_refused_by_both(
    control_plane: ControlPlane, module_namespace: str, case: str, model: dict[str, Any], says: str
) -> None:
    refusal, message = refusals(control_plane, module_namespace, manifest("composer", model))
    assert "spec.model.calls" in refusal, refusal
    assert says in message, message


@pytest.mark.parametrize("alias", ["class", "with-dash", "1st"])
def test_an_alias_must_be_a_keyword_argument(alias: str) -> None:
    # The CRD cannot constrain a map's keys; the operator refuses it (Degraded) and so does serve.
    with pytest.raises(ManifestError, match=f"alias {alias!r} must be a Python identifier"):
        parse_manifest(manifest("composer", {"handler": "m:C", "calls": {alias: "minilm"}}))


def test_an_alias_may_not_also_be_an_init_kwarg() -> None:
    model = {"handler": "m:C", "calls": {"embedder": "minilm"}, "init_kwargs": {"embedder": "x"}}
    with pytest.raises(ManifestError, match="both name 'embedder'"):
        parse_manifest(manifest("composer", model))


def test_priority_classes_are_admitted_and_a_default_or_a_name_twice_is_refused_by_both(
    control_plane: ControlPlane, module_namespace: str
) -> None:
    classes = [{"name": "search", "priority": 10}, {"name": "prefetch", "priority": -1}]
    ranked = with_spec(batching={"priority_classes": classes, "default_priority_class": "prefetch"})
    stored = admit(control_plane, module_namespace, ranked).stored
    assert stored["spec"]["batching"]["priority_classes"] == classes
    assert stored["spec"]["batching"]["queue_order"] == "priority"  # the server's default, as the model's
    assert [c.priority for c in parse_manifest(ranked).spec.batching.priority_classes] == [10, -1]

    unknown = with_spec(batching={"priority_classes": classes, "default_priority_class": "nightly"})
    refusal, message = refusals(control_plane, module_namespace, unknown)
    assert "spec.batching.default_priority_class" in refusal, refusal
    assert "'nightly' is none of the priority classes (search, prefetch)" in message

    twice = with_spec(batching={"priority_classes": [*classes, {"name": "search", "priority": 1}]})
    refusal, message = refusals(control_plane, module_namespace, twice)
    assert "spec.batching.priority_classes" in refusal and "Duplicate value" in refusal, refusal
    assert "'search'" in message


def test_canary_steps_must_rise_and_stay_within_100_percent_for_both(
    control_plane: ControlPlane, module_namespace: str
) -> None:
    steps = [{"traffic_percent": 10, "hold_s": 30}, {"traffic_percent": 50}]
    canary = with_spec(rollout={"strategy": "canary", "steps": steps, "analysis": {"max_error_rate": 0.05}})
    stored = admit(control_plane, module_namespace, canary).stored
    assert stored["spec"]["rollout"]["steps"][1] == {"traffic_percent": 50, "hold_s": 60}  # defaults filled
    assert stored["spec"]["rollout"]["analysis"]["max_p99_ratio"] == 1.5
    assert admit(control_plane, module_namespace, GOOD).stored["spec"]["rollout"]["strategy"] == "rolling"
    assert [s.traffic_percent for s in parse_manifest(with_spec(rollout={})).spec.rollout.canary_steps] == [
        10,
        50,
    ]

    falling = with_spec(
        rollout={"strategy": "canary", "steps": [{"traffic_percent": 50}, {"traffic_percent": 10}]}
    )
    refusal, message = refusals(control_plane, module_namespace, falling)
    assert "spec.rollout.steps" in refusal and "above the one before" in refusal, refusal
    assert "spec.rollout.steps" in message and "got [50, 10]" in message, message

    past = with_spec(rollout={"strategy": "canary", "steps": [{"traffic_percent": 120}]})
    refusal, message = refusals(control_plane, module_namespace, past)
    assert "spec.rollout.steps[0].traffic_percent" in refusal and "100" in refusal, refusal
    assert "traffic_percent" in message and "120" in message, message


def test_a_name_too_long_for_its_canarys_children_is_refused_by_both_naming_the_field(
    control_plane: ControlPlane, module_namespace: str
) -> None:
    longest = "n" * 56  # the canary's Service adds "-canary": 63 characters, a Service's most
    canary = {"strategy": "canary"}
    assert admit(
        control_plane, module_namespace, {**with_spec(rollout=canary), "metadata": {"name": longest}}
    ).admitted
    too_long = {**with_spec(rollout=canary), "metadata": {"name": longest + "n"}}
    refusal, message = refusals(control_plane, module_namespace, too_long)
    assert "metadata.name" in refusal and "56" in refusal and "spec.rollout.strategy canary" in refusal, (
        refusal
    )
    assert "metadata.name" in message and repr(longest + "n") in message and "56" in message, message
    # With the rolling strategy there is no canary: the name may have 63 characters.
    rolling = {**GOOD, "metadata": {"name": "n" * 63}}
    assert admit(control_plane, module_namespace, rolling).admitted
    parse_manifest(rolling)


def test_a_progress_deadline_is_defaulted_and_bounded_by_both(
    control_plane: ControlPlane, module_namespace: str
) -> None:
    stored = admit(control_plane, module_namespace, with_spec(rollout={"strategy": "canary"})).stored
    assert stored["spec"]["rollout"]["progress_deadline_s"] == 600
    refusal, message = refusals(
        control_plane, module_namespace, with_spec(rollout={"strategy": "canary", "progress_deadline_s": 5})
    )
    assert "spec.rollout.progress_deadline_s" in refusal and "30" in refusal, refusal
    assert "spec.rollout.progress_deadline_s" in message and "(got 5)" in message, message
