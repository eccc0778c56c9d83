"""The BatchedDeployment CRD, generated from the pydantic spec model so the two can never disagree.

`python -m batchd.api.crd` writes `crds/batcheddeployments.serving.batchd.dev.yaml`; a test proves
the committed file equals what this module generates. Pydantic's JSON schema is turned into a
Kubernetes *structural* schema: `$ref`s inlined, `X | None` unwrapped to `X` (absent, not null),
`exclusiveMinimum` in the OpenAPI v3.0 boolean form, free-form dicts kept with
`x-kubernetes-preserve-unknown-fields`. What pydantic checks in Python validators is restated as
CEL rules (`x-kubernetes-validations`) so that `kubectl apply` refuses the same manifests.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from batchd.api.pod import CANARY_SUFFIX, CRD_LABELS, MAX_CANARY_OWNER_NAME
from batchd.api.spec import (
    GROUP,
    KIND,
    PLURAL,
    RAY_SERVE_NAMES,
    SHORT_NAMES,
    SINGULAR,
    SOURCE_SCHEMES,
    VERSION,
    BatchedDeploymentSpec,
)
from batchd.api.status import BatchedDeploymentStatus

CRD_NAME = f"{PLURAL}.{GROUP}"
# Relative to the repository root, where `python -m batchd.api.crd` is run.
CRD_PATH = Path("crds") / f"{CRD_NAME}.yaml"

# The field validator `_known_scheme` in spec.py, restated as a pattern the API server can check.
SOURCE_PATTERN = "^(" + "|".join(re.escape(scheme) for scheme in SOURCE_SCHEMES) + ")"

# The model validator `_task_xor_handler` in spec.py, restated in CEL.
MODEL_RULES: list[dict[str, str]] = [
    {
        "rule": "has(self.task) != has(self.handler)",
        "message": "exactly one of model.task or model.handler must be set",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "!has(self.task) || has(self.source)",
        "message": "model.source is required with model.task",
        "fieldPath": ".source",
        "reason": "FieldValueRequired",
    },
    # `_calls_need_a_handler`; its check of aliases against init_kwargs, and `_aliases_are_keywords`,
    # are left to the model (the operator reports them as Degraded): CEL cannot see inside init_kwargs'
    # free-form object, and a structural schema cannot constrain a map's keys.
    {
        "rule": "!has(self.calls) || size(self.calls) == 0 || has(self.handler)",
        "message": "model.calls needs a model.handler to receive the handles",
        "fieldPath": ".calls",
        "reason": "FieldValueForbidden",
    },
    # `_generation_fits_the_task`; its check of call_kwargs' keys is left to the model, as above.
    {
        "rule": "!has(self.generation) || (has(self.task) && self.task == 'text-generation')",
        "message": "model.generation applies to model.task text-generation only",
        "fieldPath": ".generation",
        "reason": "FieldValueForbidden",
    },
]
# The model validator `_a_full_batch_fits_the_queue` in spec.py, restated in CEL. The API server
# checks every rule against the schema's own `default`s when it accepts the CRD, and `batching`
# defaults to `{}` with no field set: a rule must read only the fields it has tested with has().
# (An absent allow_small_batch is its default, true; on a stored object every field is defaulted.)
BATCHING_RULES: list[dict[str, str]] = [
    {
        "rule": "!has(self.allow_small_batch) || self.allow_small_batch "
        "|| self.max_queued_requests >= self.max_batch_size",
        "message": "batching.allow_small_batch=false needs max_queued_requests of at least max_batch_size: "
        "a full batch could never form",
        "fieldPath": ".max_queued_requests",
        "reason": "FieldValueInvalid",
    },
    # `_the_default_class_is_a_class`. (Unique names: the list is a map keyed by name.)
    {
        "rule": "(has(self.priority_classes) && size(self.priority_classes) > 0) "
        "? self.priority_classes.exists(c, c.name == "
        "(has(self.default_priority_class) ? self.default_priority_class : 'default')) "
        ": (!has(self.default_priority_class) || self.default_priority_class == 'default')",
        "message": "batching.default_priority_class must be one of batching.priority_classes' names "
        "('default' when there are none)",
        "fieldPath": ".default_priority_class",
        "reason": "FieldValueInvalid",
    },
]
# The model validator `_min_at_most_max` in spec.py, restated in CEL.
AUTOSCALING_RULES: list[dict[str, str]] = [
    {
        "rule": "self.min_replicas <= self.max_replicas",
        "message": "autoscaling.min_replicas must not exceed autoscaling.max_replicas",
        "fieldPath": ".min_replicas",
        "reason": "FieldValueInvalid",
    },
]
ROLLOUT_RULES: list[dict[str, str]] = [
    {
        "rule": "!has(self.steps) || (self.steps.map(s, s.traffic_percent).isSorted() && "
        "self.steps.all(a, self.steps.filter(b, b.traffic_percent == a.traffic_percent).size() == 1))",
        "message": "rollout.steps: each step's traffic_percent must be above the one before",
        "fieldPath": ".steps",
        "reason": "FieldValueInvalid",
    },
]
# The API server already holds names to DNS-1123 subdomains; a label also has no dots and at most
# 63 characters. Two linear checks keep the rule cheap in the API server's CEL cost estimate.
ROOT_RULES: list[dict[str, str]] = [
    {
        "rule": "self.metadata.name.size() <= 63 && !self.metadata.name.contains('.')",
        "message": "metadata.name must be a DNS-1123 label (no dots, at most 63 characters): "
        "it also names the Service",
    },
    # `_canary_children_fit_their_names` in spec.py. (`rollout` defaults to {}, so it is there on
    # every stored object; `strategy` only once defaulted.)
    {
        "rule": "!has(self.spec.rollout) || !has(self.spec.rollout.strategy) "
        f"|| self.spec.rollout.strategy != 'canary' || self.metadata.name.size() <= {MAX_CANARY_OWNER_NAME}",
        # No fieldPath: `metadata` has no schema of its own to point into; the message names it.
        "message": f"metadata.name may have at most {MAX_CANARY_OWNER_NAME} characters with "
        f"spec.rollout.strategy canary: the canary's Service adds {CANARY_SUFFIX!r} to it",
        "reason": "FieldValueInvalid",
    },
]

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Model", "type": "string", "jsonPath": ".status.model"},
    {"name": "Desired", "type": "integer", "jsonPath": ".status.desired_replicas"},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.ready_replicas"},
    {"name": "Revision", "type": "string", "jsonPath": ".status.revision"},
    {"name": "Rollout", "type": "string", "jsonPath": ".status.rollout.phase"},
    {"name": "Canary", "type": "integer", "jsonPath": ".status.rollout.canary_percent"},
    {"name": "Max-Batch", "type": "integer", "jsonPath": ".spec.batching.max_batch_size"},
    {"name": "Load", "type": "integer", "jsonPath": ".status.autoscaling.load", "priority": 1},
    {"name": "Status", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].reason'},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

_DROPPED_KEYS = {"title", "additionalProperties", "$defs"}


def _structural(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """One pydantic JSON-schema node as a Kubernetes structural-schema node."""
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{key: value for key, value in node.items() if key != "$ref"}}
        return _structural(merged, defs)
    if "anyOf" in node:
        # `X | None`: Kubernetes has no null for our fields; absent means None.
        branches = [branch for branch in node["anyOf"] if branch.get("type") != "null"]
        if len(branches) != 1:
            raise ValueError(f"cannot express anyOf {node['anyOf']!r} structurally")
        rest = {key: value for key, value in node.items() if key != "anyOf"}
        return _structural({**branches[0], **rest}, defs)

    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS or (key == "default" and value is None):
            continue
        if key == "exclusiveMinimum":  # JSON Schema 2020-12 number -> OpenAPI v3.0 boolean form
            out["minimum"], out["exclusiveMinimum"] = value, True
        elif key == "properties":
            out[key] = {name: _structural(child, defs) for name, child in value.items()}
        elif key == "items":
            out[key] = _structural(value, defs)
        elif key == "description":
            out[key] = " ".join(value.split())  # docstrings wrap; kubectl explain re-wraps
        else:
            out[key] = value

    extra = node.get("additionalProperties")
    if out.get("type") == "object" and "properties" not in out:
        if isinstance(extra, dict) and extra:
            out["additionalProperties"] = _structural(extra, defs)  # a typed map, e.g. nodeSelector
        else:
            out["x-kubernetes-preserve-unknown-fields"] = True  # free-form: kwargs, embedded K8s types
    return out


def _without_defaults(node: Any) -> Any:
    """A schema with no `default`s: the operator writes every field of a status section it writes,
    and the API server should add nothing of its own."""
    if isinstance(node, dict):
        return {key: _without_defaults(value) for key, value in node.items() if key != "default"}
    if isinstance(node, list):
        return [_without_defaults(item) for item in node]
    return node


def status_schema() -> dict[str, Any]:
    """The structural schema of `status`, from `BatchedDeploymentStatus`."""
    raw = BatchedDeploymentStatus.model_json_schema(by_alias=True, mode="serialization")
    schema: dict[str, Any] = _without_defaults(_structural(raw, raw.get("$defs", {})))
    # Keyed by type, as every Kubernetes object's conditions are.
    conditions = schema["properties"]["conditions"]
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    return schema


def spec_schema() -> dict[str, Any]:
    """The structural schema of `spec`, from `BatchedDeploymentSpec`."""
    raw = BatchedDeploymentSpec.model_json_schema(by_alias=True, mode="validation")
    schema = _structural(raw, raw.get("$defs", {}))
    model = schema["properties"]["model"]
    model["properties"]["source"]["pattern"] = SOURCE_PATTERN
    model["x-kubernetes-validations"] = copy.deepcopy(MODEL_RULES)
    schema["properties"]["autoscaling"]["x-kubernetes-validations"] = copy.deepcopy(AUTOSCALING_RULES)
    # A default `{}` lets the API server fill in every batching default (and the printer column).
    schema["properties"]["batching"]["default"] = {}
    schema["properties"]["batching"]["x-kubernetes-validations"] = copy.deepcopy(BATCHING_RULES)
    # Keyed by name: the API server refuses two classes of one name, and a patch merges by name.
    classes = schema["properties"]["batching"]["properties"]["priority_classes"]
    classes["x-kubernetes-list-type"] = "map"
    classes["x-kubernetes-list-map-keys"] = ["name"]
    schema["properties"]["rollout"]["default"] = {}
    schema["properties"]["rollout"]["x-kubernetes-validations"] = copy.deepcopy(ROLLOUT_RULES)
    _refuse_ray_serve_names(schema)
    return schema


def _refuse_ray_serve_names(schema: dict[str, Any]) -> None:
    """Ray Serve's names for batchd's fields (`RAY_SERVE_NAMES`), refused with the field to use.

    Left unknown, `kubectl apply` would say only "unknown field"; declared (their descriptions
    say what to use instead) and forbidden by a rule, it says which field is batchd's.
    """
    nodes = {"spec": schema, "batching": schema["properties"]["batching"]}
    for (parent, name), advice in RAY_SERVE_NAMES.items():
        node = nodes[parent]
        kind: dict[str, Any] = (
            {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
            if name.endswith("config")
            else {"type": "number"}
        )
        node["properties"][name] = {**kind, "description": f"Not used: {advice}."}
        node.setdefault("x-kubernetes-validations", []).append(
            {
                "rule": f"!has(self.{name})",
                "message": advice,
                "fieldPath": f".{name}",
                "reason": "FieldValueForbidden",
            }
        )


def crd() -> dict[str, Any]:
    """The whole CustomResourceDefinition."""
    root = {
        "type": "object",
        "required": ["spec"],
        "x-kubernetes-validations": copy.deepcopy(ROOT_RULES),
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema(),
            "status": status_schema(),
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": dict(CRD_LABELS),
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": ["all", "batchd"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.num_replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": copy.deepcopy(PRINTER_COLUMNS),
                }
            ],
        },
    }


def render() -> str:
    """The CRD as the YAML text committed in `crds/`."""
    header = (
        "# Generated by `python -m batchd.api.crd` from batchd/api/spec.py: do not edit by hand.\n"
        "# Helm never upgrades CRDs: after upgrading batchd, run `kubectl apply -f` on this file.\n"
    )
    return header + yaml.dump(crd(), Dumper=_PlainDumper, sort_keys=False, width=100)


class _PlainDumper(yaml.SafeDumper):
    """Writes repeated parts (inputs and outputs share a schema) in full: no YAML anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the BatchedDeployment CRD generated from the spec.")
    parser.add_argument("--output", type=Path, default=CRD_PATH, help="where to write; '-' for stdout")
    args = parser.parse_args(argv)
    text = render()
    if str(args.output) == "-":
        sys.stdout.write(text)
    else:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text)
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
