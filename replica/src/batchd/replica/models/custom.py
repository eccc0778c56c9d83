"""A user's own batch handler, named by import path, as Ray Serve users write them.

`module:Class.method` (the seeds' `examples.adder:BatchAdder.handle_batch`), `module:Class`
(an instance that is callable) or `module:function`. The handler takes a list of items and
returns a list of results of the same length; sync or `async def`. Its first parameter's
annotation (`List[int]`) gives the item type, so each item is validated and coerced when it
arrives, not when it has already joined somebody else's batch.
"""

from __future__ import annotations

import importlib
import inspect
import typing
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import TypeAdapter

from batchd.api.spec import ModelSpec
from batchd.replica.errors import BatchSizeMismatch
from batchd.replica.models.base import Datatype, ModelLoadError, ModelMetadata, TensorSpec
from batchd.replica.models.executor import ModelExecutor
from batchd.replica.models.results import plain

_DATATYPES: dict[Any, Datatype] = {bool: "BOOL", int: "INT64", float: "FP64", str: "BYTES"}


class CustomHandlerModel:
    """A BatchModel around a user's handler callable."""

    def __init__(
        self, handler_path: str, handler: Callable[..., Any], executor: ModelExecutor, owner: Any
    ) -> None:
        self._path = handler_path
        self._handler = handler
        self._is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
            getattr(handler, "__call__", None)  # noqa: B004 - an instance with `async def __call__`
        )
        self._executor = executor
        self._owner = owner
        item_type = item_type_of(handler)
        self.item_adapter: TypeAdapter[Any] = TypeAdapter(item_type)
        datatype = _DATATYPES.get(item_type, "BYTES")
        self.metadata = ModelMetadata(
            platform="python",
            inputs=(TensorSpec("input", datatype),),
            outputs=(TensorSpec("output", _DATATYPES.get(return_item_type_of(handler), "BYTES")),),
        )

    async def predict_batch(self, items: list[Any]) -> list[Any]:
        if self._is_async:
            results = await self._executor.run_async(self._handler(items))
        else:
            results = await self._executor.run_sync(self._handler, items)
        return self._checked(results, len(items))

    async def warmup(self, max_batch_size: int) -> None:
        warmup = getattr(self._owner, "warmup", None)
        if callable(warmup):
            if inspect.iscoroutinefunction(warmup):
                await self._executor.run_async(warmup())
            else:
                await self._executor.run_sync(warmup)

    def close(self) -> None:
        self._executor.close()

    def _checked(self, results: Any, expected: int) -> list[Any]:
        results = plain(results)
        if not isinstance(results, Sequence) or isinstance(results, (str, bytes)):
            raise TypeError(
                f"handler {self._path} returned {type(results).__name__}; "
                "it must return a list, one result per item"
            )
        if len(results) != expected:
            raise BatchSizeMismatch(
                f"handler {self._path} returned {len(results)} result(s) for a batch of {expected}"
            )
        return list(results)


def load_custom_handler(spec: ModelSpec, executor: ModelExecutor) -> CustomHandlerModel:
    """Import and instantiate `spec.handler` (in the loading thread: constructors may load weights)."""
    path = spec.handler
    assert path is not None
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ModelLoadError(
            f"model.handler: cannot import module {module_name!r} of {path!r}: {error}"
        ) from error
    owner_name, _, method_name = attribute.partition(".")
    try:
        target = getattr(module, owner_name)
    except AttributeError:
        raise ModelLoadError(
            f"model.handler: module {module_name!r} has no attribute {owner_name!r}"
        ) from None

    if inspect.isclass(target):
        try:
            owner = target(**spec.init_kwargs)
        except TypeError as error:
            raise ModelLoadError(
                f"model.init_kwargs: {owner_name}() refused {spec.init_kwargs!r}: {error}"
            ) from error
        if method_name:
            handler = getattr(owner, method_name, None)
            if not callable(handler):
                raise ModelLoadError(f"model.handler: {owner_name} has no method {method_name!r}")
        elif callable(owner):
            handler = owner
        else:
            raise ModelLoadError(f"model.handler: instances of {owner_name} are not callable; name a method")
    elif callable(target) and not method_name:
        if spec.init_kwargs:
            raise ModelLoadError(f"model.init_kwargs: {path!r} is a function, which takes no init_kwargs")
        owner, handler = None, target
    else:
        raise ModelLoadError(f"model.handler: {path!r} is neither a class nor a function")
    return CustomHandlerModel(path, handler, executor, owner)


def item_type_of(handler: Callable[..., Any]) -> Any:
    """T of the first parameter's `list[T]` / `List[T]` / `Sequence[T]` annotation; Any otherwise."""
    function = handler if inspect.isfunction(handler) or inspect.ismethod(handler) else handler.__call__  # type: ignore[operator]
    try:
        hints = typing.get_type_hints(function)
        parameters = [p for p in inspect.signature(function).parameters.values() if p.name != "self"]
    except (NameError, TypeError, ValueError):
        return Any
    if not parameters or parameters[0].name not in hints:
        return Any
    return _element_type(hints[parameters[0].name])


def return_item_type_of(handler: Callable[..., Any]) -> Any:
    function = handler if inspect.isfunction(handler) or inspect.ismethod(handler) else handler.__call__  # type: ignore[operator]
    try:
        hint = typing.get_type_hints(function).get("return")
    except (NameError, TypeError):
        return Any
    return _element_type(hint) if hint is not None else Any


def _element_type(hint: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin in (list, Sequence, typing.Sequence) or origin is getattr(typing, "List", None):
        (element,) = typing.get_args(hint) or (Any,)
        return element
    return Any
