"""BatchedDeployment specs generated for property tests: every edit a user makes to a manifest
between two `kubectl apply`s, as hypothesis strategies.

Each spec is valid (the model accepts it); two of them differ in any way a user edits a file:
an optional field dropped or added, a handler switched with a pipeline task, scheduling
constraints, env, volumes, resources, the image, batching, autoscaling and either rollout
strategy. Not generated: `rollout.paused` and `rollout.abort`, commands a user gives a running
rollout, whose effect depends on the rollout they are given to by design.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

HANDLER = "batchd.testing.batch_handlers:SlowAdder"


def _optional(key: str, values: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """{key: value} or nothing: a field present or dropped."""
    return st.one_of(st.just({}), values.map(lambda value: {key: value}))


def _fields(*parts: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.tuples(*parts).map(lambda found: {key: value for part in found for key, value in part.items()})


_handler = _fields(
    st.just({"handler": HANDLER}),
    _optional(
        "init_kwargs",
        st.dictionaries(st.sampled_from(["delay_s", "scale", "offset"]), st.integers(0, 3), max_size=3),
    ),
)
_task = _fields(
    st.sampled_from([{"task": "feature-extraction"}, {"task": "fill-mask"}]),
    st.sampled_from([{"source": "hf://org/model-a"}, {"source": "pvc://weights/model-b"}]),
)
models = st.tuples(
    st.one_of(_handler, _task),
    _optional("name", st.sampled_from(["served", "other"])),
    _optional("device", st.sampled_from(["cpu", "auto"])),
    _optional("dtype", st.sampled_from(["float32", "auto"])),
).map(lambda parts: {key: value for part in parts for key, value in part.items()})

_batching = _fields(
    _optional("max_batch_size", st.sampled_from([1, 8, 32])),
    _optional("batch_wait_timeout_s", st.sampled_from([0, 0.01])),
    _optional("request_timeout_s", st.sampled_from([5, 30])),
    _optional(
        "priority_classes",
        st.just([{"name": "default", "priority": 0}, {"name": "bulk", "priority": -1}]),
    ),
)
_autoscaling = _fields(
    st.sampled_from([{"min_replicas": 0}, {"min_replicas": 1}]),
    st.just({"max_replicas": 4}),
)
_rollout = st.one_of(
    st.just({}),
    st.just({"strategy": "rolling"}),
    _fields(
        st.just({"strategy": "canary"}),
        _optional(
            "steps", st.just([{"traffic_percent": 25, "hold_s": 1}, {"traffic_percent": 60, "hold_s": 1}])
        ),
    ),
)
_toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
_affinity = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}
            ]
        }
    }
}
_volumes = st.just(
    {
        "volumes": [{"name": "scratch", "emptyDir": {}}],
        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
    }
)

specs = _fields(
    models.map(lambda model: {"model": model}),
    _optional("num_replicas", st.integers(0, 3)),
    _optional("batching", _batching),
    _optional("autoscaling", _autoscaling),
    _optional("image", st.sampled_from(["registry.test/replica:1", "registry.test/replica:2"])),
    _optional(
        "resources", st.sampled_from([{"limits": {"nvidia.com/gpu": 1}}, {"requests": {"cpu": "100m"}}])
    ),
    _optional("nodeSelector", st.sampled_from([{"gpu": "a100"}, {"zone": "a", "gpu": "h100"}])),
    _optional("tolerations", st.just([_toleration])),
    _optional("affinity", st.just(_affinity)),
    _optional("env", st.sampled_from([[{"name": "A", "value": "1"}], [{"name": "B", "value": "2"}]])),
    st.one_of(st.just({}), _volumes),
    _optional("rollout", _rollout),
)
