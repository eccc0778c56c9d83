"""Custom batch handlers: how they are named, called, typed and checked."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from batchd.api.spec import ModelSpec
from batchd.replica.errors import BatchSizeMismatch
from batchd.replica.loading import load_model
from batchd.replica.models import ModelLoadError
from batchd.replica.models.base import BatchModel


def load(handler: str, **init_kwargs: Any) -> BatchModel:
    spec = ModelSpec(handler=handler, init_kwargs=init_kwargs)
    return load_model(spec, mirror_dir=None, pvc_root=Path("/models"))


def test_the_seeds_adder_runs_unchanged_and_types_its_items() -> None:
    model = load("examples.adder:BatchAdder.handle_batch")
    try:
        assert asyncio.run(model.predict_batch([1, 2, 3])) == [2, 3, 4]
        assert model.item_adapter.validate_python("41") == 41  # List[int]: a query string coerces
        with pytest.raises(ValidationError):
            model.item_adapter.validate_python("abc")
        assert model.metadata.inputs[0].datatype == "INT64"
    finally:
        model.close()


def test_a_plain_function_is_a_handler() -> None:
    model = load("batchd.testing.batch_handlers:add_one")
    try:
        assert asyncio.run(model.predict_batch([1])) == [2]
    finally:
        model.close()


def gate_handler(
    monkeypatch: pytest.MonkeyPatch, *, is_async: bool
) -> tuple[str, threading.Event, threading.Event]:
    """A handler that blocks its thread until the test's event loop releases it."""
    started, released = threading.Event(), threading.Event()

    def block(texts: list[str]) -> list[str]:
        started.set()
        # Only a coroutine on the test's loop sets `released`: if the handler held that loop, it never would.
        if not released.wait(timeout=10):
            raise TimeoutError("the calling event loop never ran while the handler blocked")
        return [text.upper() for text in texts]

    class Gate:
        async def handle_async(self, texts: list[str]) -> list[str]:
            return block(texts)  # blocking inside `async def`, as Ray Serve's tutorial handlers do

        def handle_sync(self, texts: list[str]) -> list[str]:
            return block(texts)

    module = types.ModuleType("gate_handlers")
    module.Gate = Gate  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gate_handlers", module)
    return f"gate_handlers:Gate.handle_{'async' if is_async else 'sync'}", started, released


@pytest.mark.parametrize("is_async", [True, False], ids=["async-def", "def"])
async def test_a_blocking_handler_does_not_stall_the_servers_event_loop(
    monkeypatch: pytest.MonkeyPatch, is_async: bool
) -> None:
    handler, started, released = gate_handler(monkeypatch, is_async=is_async)
    model = load(handler)
    try:
        prediction = asyncio.create_task(model.predict_batch(["a", "b"]))
        deadline = time.monotonic() + 10
        while not started.is_set():  # this loop keeps running while the handler's thread blocks
            assert time.monotonic() < deadline, "the handler never started"
            await asyncio.sleep(0.005)
        assert not prediction.done()
        released.set()
        assert await asyncio.wait_for(prediction, timeout=10) == ["A", "B"]
    finally:
        released.set()
        model.close()


def test_a_handler_returning_the_wrong_number_of_results_is_named() -> None:
    model = load("batchd.testing.batch_handlers:WrongLength")
    try:
        with pytest.raises(
            BatchSizeMismatch,
            match=(
                r"handler batchd.testing.batch_handlers:WrongLength returned 2 result\(s\)"
                r" for a batch of 3"
            ),
        ):
            asyncio.run(model.predict_batch([1, 2, 3]))
    finally:
        model.close()


def test_a_handler_returning_something_else_than_a_list_is_named() -> None:
    model = load("batchd.testing.batch_handlers:NotAList")
    try:
        with pytest.raises(TypeError, match="returned dict; it must return a list"):
            asyncio.run(model.predict_batch([1]))
    finally:
        model.close()


def test_a_handlers_warmup_runs_before_it_serves() -> None:
    model = load("batchd.testing.batch_handlers:WithWarmup")
    try:
        asyncio.run(model.warmup(8))
        assert asyncio.run(model.predict_batch([1.5])) == [3.0]
        assert model.metadata.inputs[0].datatype == "FP64"
    finally:
        model.close()


@pytest.mark.parametrize(
    ("handler", "init_kwargs", "message"),
    [
        ("no_such_module:Thing", {}, "model.handler: cannot import module 'no_such_module'"),
        ("batchd.testing.batch_handlers:Missing", {}, "has no attribute 'Missing'"),
        ("batchd.testing.batch_handlers:SlowAdder.nope", {}, "SlowAdder has no method 'nope'"),
        (
            "batchd.testing.batch_handlers:add_one",
            {"x": 1},
            "model.init_kwargs: 'batchd.testing.batch_handlers:add_one' is a function",
        ),
        (
            "batchd.testing.batch_handlers:SlowAdder",
            {"speed": 2},
            "model.init_kwargs: SlowAdder() refused {'speed': 2}",
        ),
    ],
)
def test_handlers_that_cannot_load_say_which_field_is_wrong(
    handler: str, init_kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ModelLoadError) as refused:
        load(handler, **init_kwargs)
    assert message in str(refused.value)
