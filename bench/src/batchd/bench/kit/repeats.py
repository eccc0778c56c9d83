"""Interleaved repeats: on a small shared machine nothing is measured once, and the subjects take
turns within each repeat, so that a slow minute falls on all of them alike."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def rotated(subjects: Sequence[T], repeat: int) -> list[T]:
    """The order of one repeat: who goes first turns with every repeat, so that no subject always
    runs right after the same neighbour."""
    shift = repeat % len(subjects) if subjects else 0
    return [*subjects[shift:], *subjects[:shift]]
