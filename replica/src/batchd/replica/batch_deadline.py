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
_batch_class: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "batchd_batch_class", default=None
)


def set_batch_class(priority_class: str, caller: str) -> contextvars.Token[tuple[str, str] | None]:
    """From now on in this context, the batch is of `priority_class`, for `caller`."""
    return _batch_class.set((priority_class, caller))


def reset_batch_class(token: contextvars.Token[tuple[str, str] | None]) -> None:
    _batch_class.reset(token)


def batch_class() -> tuple[str, str] | None:
    """The current batch's class and caller (""), which its calls carry; None outside a batch."""
    return _batch_class.get()


def seconds_left(default_s: float) -> float:
    """Time left to the current batch's deadline; `default_s` outside a batch."""
    deadline = _batch_deadline.get()
    return default_s if deadline is None else deadline - time.monotonic()
