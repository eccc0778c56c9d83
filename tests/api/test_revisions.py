"""A deployment's revision: a new one for a change to what decides the answers, none for a retune."""

from __future__ import annotations

import copy
from typing import Any

from batchd.api.manifest import parse_manifest
from batchd.api.revisions import REVISION_LENGTH, revision_of
from batchd.testing.manifests import manifest


def revision(document: dict[str, Any], image: str = "batchd-replica:1") -> str:
    spec = parse_manifest(document).spec
    return revision_of(spec, spec.image or image)


def changed(document: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    copied = copy.deepcopy(document)
    node = copied["spec"]
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return copied


def test_the_model_or_the_image_makes_a_new_revision_and_batching_or_scale_does_not() -> None:
    base = manifest("adder")
    first = revision(base)
    assert len(first) == REVISION_LENGTH and first == revision(copy.deepcopy(base))
    new: list[tuple[tuple[str, ...], Any]] = [
        (("model", "handler"), "examples.adder:BatchAdder.handle_batch_v2"),
        (("model", "init_kwargs"), {"offset": 1}),
        (("model", "device"), "cuda"),
        (("image",), "registry.example/batchd-replica:2"),
    ]
    same: list[tuple[tuple[str, ...], Any]] = [
        (("batching", "max_batch_size"), 8),
        (("num_replicas",), 3),
        (("rollout", "strategy"), "canary"),
    ]
    for path, value in new:
        assert revision(changed(base, path, value)) != first, path
    for path, value in same:
        assert revision(changed(base, path, value)) == first, path
    assert revision(base, image="batchd-replica:2") != first  # the operator's default image moved


def test_a_revision_is_never_read_as_a_number() -> None:
    # A label value a YAML parser takes for a number (0e12, 1234) is refused as a label.
    revisions = {revision(changed(manifest("adder"), ("model", "init_kwargs"), {"n": n})) for n in range(300)}
    assert len(revisions) == 300
    for value in revisions:
        assert not any(char in value for char in "013aeiou"), value
        assert not value.isdigit()
