"""The deadline and the priority class of the batch the model is computing, for code the model runs.

The batcher knows when each request it holds stops waiting (`request_timeout_s` after it was
admitted); the model code does not. A handler that calls another deployment (`handles`) must not
wait for it past the moment nobody waits for the batch, or a slow callee would hold the model, and
the replica, long after every request in the batch had its 504. So the batcher sets the batch's
deadline here while the model computes it, and it travels with the context to wherever the model
code runs (the handler's own event loop copies it with the coroutine).

Likewise the batch's class and caller: a call made for a high-class request must not wait behind
the callee's low-class queue (a priority inversion, which Kubernetes' API Priority and Fairness
warns of for recursive calls), so the handles send them on.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable

# time.monotonic() of the latest deadline among the batch's items; None outside a batch.
_batch_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "batchd_batch_deadline", default=None
)


def set_batch_deadline(deadline: float) -> contextvars.Token[float | None]:
    """From now on in this context, the batch's answers are wanted until `deadline` (time.monotonic())."""
    return _batch_deadline.set(deadline)


def reset_batch_deadline(token: contextvars.Token[float | None]) -> None:
    _batch_deadline.reset(token)


def batch_deadline() -> float | None:
    """time.monotonic() after which nobody waits for the current batch; None outside a batch."""
    return _batch_deadline.get()


# The class (its name) and caller ("": none) of the batch's requests; None outside a batch.
# The class is worked out only when a call asks: most batches make no call.
ClassOf = Callable[[], tuple[str, str]]
_batch_class: contextvars.ContextVar[ClassOf | None] = contextvars.ContextVar(
    "batchd_batch_class", default=None
)


def set_batch_class(class_of: ClassOf) -> contextvars.Token[ClassOf | None]:
    """From now on in this context, `class_of()` says the batch's priority class and caller."""
    return _batch_class.set(class_of)


def reset_batch_class(token: contextvars.Token[ClassOf | None]) -> None:
    _batch_class.reset(token)


def batch_class() -> tuple[str, str] | None:
    """The current batch's class and caller (""), which its calls carry; None outside a batch."""
    class_of = _batch_class.get()
    return None if class_of is None else class_of()


def seconds_left(default_s: float) -> float:
    """Time left to the current batch's deadline; `default_s` outside a batch."""
    deadline = _batch_deadline.get()
    return default_s if deadline is None else deadline - time.monotonic()
