"""What a model takes and returns: Python item types, and the V2 tensors that carry them.

A handler's annotation (`def handle(self, numbers: List[int]) -> List[float]`) says it in
Python; `model.inputs` and `model.outputs` in the spec say it in V2 tensors, for handlers whose
annotation cannot. Either way the replica checks and converts every item before it is queued,
and the V2 model metadata states the same thing, so that a client that reads the metadata
(tritonclient does) sends what the model can use.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Sequence
from typing import Any, TypedDict

from batchd.api.spec import Datatype, TensorSpec

_INTEGER: frozenset[str] = frozenset(
    {"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"}
)
_FLOAT: frozenset[str] = frozenset({"FP16", "FP32", "FP64"})
_BY_PYTHON: dict[Any, Datatype] = {bool: "BOOL", int: "INT64", float: "FP64", str: "BYTES"}


def python_type(datatype: str) -> type:
    """The Python type of one element of a V2 tensor."""
    if datatype == "BOOL":
        return bool
    if datatype in _INTEGER:
        return int
    if datatype in _FLOAT:
        return float
    return str


def datatype_of(python: Any) -> Datatype:
    """The V2 datatype that carries a Python item type; BYTES when it is no scalar (JSON text)."""
    if typing.get_origin(python) is typing.Annotated:  # Annotated[int, Field(ge=0)] is still an int
        python = typing.get_args(python)[0]
    return _BY_PYTHON.get(python, "BYTES")


def item_type(inputs: Sequence[TensorSpec]) -> Any:
    """The type of one batch item for these inputs: one row of the one input, or a dict of rows."""
    row_types = {spec.name: _row_type(spec) for spec in inputs}
    if len(row_types) == 1:
        return next(iter(row_types.values()))
    return TypedDict("Item", row_types)  # type: ignore[operator]


def _row_type(spec: TensorSpec) -> Any:
    """One row of a tensor (its shape without the batch dimension), nested lists of elements."""
    row: Any = python_type(spec.datatype)
    for _ in spec.shape[1:]:
        row = list[row]
    return row


def item_type_of(handler: Callable[..., Any]) -> Any:
    """T of the first parameter's `list[T]` / `List[T]` / `Sequence[T]` annotation; Any otherwise."""
    function = _function(handler)
    try:
        # With extras: constraints such as Annotated[list[float], Field(min_length=8)] are checked too.
        hints = typing.get_type_hints(function, include_extras=True)
        parameters = [p for p in inspect.signature(function).parameters.values() if p.name != "self"]
    except (NameError, TypeError, ValueError):
        return Any
    if not parameters or parameters[0].name not in hints:
        return Any
    return _element_type(hints[parameters[0].name])


def return_item_type_of(handler: Callable[..., Any]) -> Any:
    """T of the return annotation's `list[T]`; Any otherwise."""
    try:
        hint = typing.get_type_hints(_function(handler)).get("return")
    except (NameError, TypeError):
        return Any
    return _element_type(hint) if hint is not None else Any


def _function(handler: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.isfunction(handler) or inspect.ismethod(handler):
        return handler
    call: Callable[..., Any] = handler.__call__  # type: ignore[operator]
    return call


def _element_type(hint: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin in (list, Sequence, typing.Sequence) or origin is getattr(typing, "List", None):
        (element,) = typing.get_args(hint) or (Any,)
        return element
    return Any
