"""A user's own batch handler, named by import path, as Ray Serve users write them.

`module:Class.method` (as in `examples.adder:BatchAdder.handle_batch`), `module:Class`
(an instance that is callable) or `module:function`. The handler takes a list of items and
returns a list of results of the same length; sync or `async def`. Its first parameter's
annotation (`List[int]`), or else the spec's `model.inputs`, gives the item type, so each item
is validated and coerced when it arrives, not when it has already joined somebody else's batch.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import TypeAdapter

from batchd.api.spec import ModelSpec, TensorSpec
from batchd.replica.errors import BatchSizeMismatch
from batchd.replica.json_encoding import plain
from batchd.replica.models.base import ModelLoadError, ModelMetadata
from batchd.replica.models.executor import ModelExecutor
from batchd.replica.models.signature import datatype_of, item_type, item_type_of, return_item_type_of


class CustomHandlerModel:
    """A BatchModel around a user's handler callable."""

    def __init__(
        self,
        handler_path: str,
        handler: Callable[..., Any],
        executor: ModelExecutor,
        owner: Any,
        inputs: tuple[TensorSpec, ...] | None = None,
        outputs: tuple[TensorSpec, ...] | None = None,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self._path = handler_path
        self._on_close = on_close
        self._handler = handler
        self._is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
            getattr(handler, "__call__", None)  # noqa: B004 - an instance with `async def __call__`
        )
        self._executor = executor
        self._owner = owner
        annotated = item_type_of(handler)
        # The annotation is what the handler expects; declared inputs say it for handlers without one.
        self.item_adapter: TypeAdapter[Any] = TypeAdapter(
            item_type(inputs) if annotated is Any and inputs else annotated
        )
        self.metadata = ModelMetadata(
            platform="python",
            inputs=inputs or (TensorSpec(name="input", datatype=datatype_of(annotated)),),
            outputs=outputs
            or (TensorSpec(name="output", datatype=datatype_of(return_item_type_of(handler))),),
        )

    @property
    def is_async(self) -> bool:
        """`async def`: runs on the executor's own event loop, where it may await (handles)."""
        return self._is_async

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
        if self._on_close is not None:  # before the handler's loop stops: its sessions live there
            self._on_close()
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


def load_custom_handler(
    spec: ModelSpec,
    executor: ModelExecutor,
    addresses: Mapping[str, str] | None = None,
    composer: str = "",
) -> CustomHandlerModel:
    """Import and instantiate `spec.handler` (in the loading thread: constructors may load weights).

    With `model.calls`, the constructor also receives one handle per alias (see `handles`), to the
    callee at `addresses[alias]`, calling as deployment `composer`.
    """
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

    handles, on_close = _handles(spec, addresses or {}, composer)
    if inspect.isclass(target):
        try:
            owner = target(**spec.init_kwargs, **handles)
        except TypeError as error:
            field = "model.init_kwargs" if not handles else "model.init_kwargs or model.calls"
            given = {**spec.init_kwargs, **dict.fromkeys(handles, "<handle>")}
            raise ModelLoadError(f"{field}: {owner_name}() refused {given!r}: {error}") from error
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
        if handles:
            raise ModelLoadError(
                f"model.calls: {path!r} is a function; name a class, whose constructor receives the handles"
            )
        owner, handler = None, target
    else:
        raise ModelLoadError(f"model.handler: {path!r} is neither a class nor a function")
    model = CustomHandlerModel(path, handler, executor, owner, spec.inputs, spec.outputs, on_close)
    if handles and not model.is_async:
        raise ModelLoadError(
            f"model.calls: {path!r} is not `async def`; a handler awaits its handles (Ray Serve's "
            "composed deployments are async for the same reason)"
        )
    return model


def _handles(
    spec: ModelSpec, addresses: Mapping[str, str], composer: str
) -> tuple[dict[str, Any], Callable[[], None] | None]:
    """The handles `model.calls` asks for, and what closes their HTTP client; none without calls."""
    if not spec.calls and not addresses:
        return {}, None
    from batchd.replica.handles import CallClient, make_handles  # aiohttp: only composers need it

    client = CallClient()
    try:
        return make_handles(spec.calls, addresses, client, composer=composer), client.close
    except ValueError as error:
        raise ModelLoadError(str(error)) from None
