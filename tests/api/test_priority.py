"""How a request names its priority class and caller, read one way by the router and the replicas:
the headers, else an OpenAI body's `metadata.priority` and `user`; class names of any case; an
unknown class refused naming it, unless a composer's call carries it."""

from __future__ import annotations

import pytest

from batchd.api.priority import (
    PriorityClass,
    PriorityClasses,
    PriorityError,
    UnknownPriorityClass,
    asked_class,
    named_in_body,
    named_in_headers,
)
from batchd.api.spec import BatchingSpec

CLASSES = PriorityClasses.of(
    BatchingSpec.model_validate(
        {
            "priority_classes": [
                {"name": "batch", "priority": 0},
                {"name": "gold", "priority": 5, "queue_timeout_s": 2},
                {"name": "silver", "priority": 5},
            ],
            "default_priority_class": "batch",
        }
    )
)
GOLD = PriorityClass("gold", 5, 2.0)


def test_the_classes_are_highest_first_equals_in_the_order_the_spec_gives_them() -> None:
    assert CLASSES.names == ["gold", "silver", "batch"]
    assert CLASSES.default == PriorityClass("batch", 0)
    assert PriorityClasses.of(BatchingSpec()).names == ["default"]


def test_a_header_names_the_class_in_any_case_and_the_caller_as_sent() -> None:
    assert asked_class(CLASSES, b"Gold", b"Tenant-A") == (GOLD, "Tenant-A")
    assert asked_class(CLASSES, "silver") == (PriorityClass("silver", 5), "")
    assert asked_class(CLASSES, None, b"t") == (CLASSES.default, "t")  # none named: the default
    headers = [(b"Batchd-Priority", b"gold"), (b"BATCHD-FAIRNESS-ID", b"t"), (b"batchd-called-by", b"c")]
    assert named_in_headers(headers) == (b"gold", b"t", True)
    assert named_in_headers([(b"content-type", b"application/json")]) == (None, None, False)


def test_an_openai_body_names_them_where_the_headers_do_not() -> None:
    body = {"model": "m", "metadata": {"priority": "GOLD", "trace": "x"}, "user": "tenant-a"}
    assert asked_class(CLASSES, None, None, body) == (GOLD, "tenant-a")
    assert asked_class(CLASSES, b"silver", None, body) == (PriorityClass("silver", 5), "tenant-a")
    assert asked_class(CLASSES, None, b"b", body) == (GOLD, "b")  # the headers win
    assert named_in_body({"model": "m"}) == (None, None)
    with pytest.raises(PriorityError, match=r"^metadata: expected an object of at most 16 string values"):
        asked_class(CLASSES, b"gold", None, {"metadata": {"priority": 3}})  # checked even so
    with pytest.raises(PriorityError, match=r"^user: expected a string, got 7"):
        named_in_body({"user": 7})


def test_an_unknown_class_is_refused_naming_it_and_the_classes_there_are() -> None:
    with pytest.raises(UnknownPriorityClass) as refused:
        asked_class(CLASSES, b"Urgent")
    assert str(refused.value) == (
        "priority class (batchd-priority or metadata.priority): "
        "expected one of gold, silver, batch, got 'Urgent'"
    )
    # A composer's call carries a class of the composer's: one the callee lacks is its default.
    assert asked_class(CLASSES, b"urgent", b"t", composed=True) == (CLASSES.default, "t")
