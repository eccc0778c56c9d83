"""The bounded poll every test waits with: it returns what the probe found, and a wait that runs out
says what the probe last saw."""

from __future__ import annotations

import itertools

import pytest

from batchd.testing.waiting import NotYet, eventually


def test_eventually_returns_the_first_truthy_answer() -> None:
    answers = itertools.chain([None, False, NotYet("starting")], itertools.repeat({"ready": 2}))
    assert eventually(lambda: next(answers), what="two ready", interval_s=0.001) == {"ready": 2}


def test_a_wait_that_runs_out_names_what_it_awaited_and_what_the_probe_last_saw() -> None:
    polls = itertools.count()
    with pytest.raises(AssertionError) as failed:
        eventually(lambda: NotYet(f"{next(polls) % 3} of 4 ready"), what="four replicas", timeout_s=0.05)
    message = str(failed.value)
    assert "four replicas" in message
    assert "of 4 ready" in message and "NotYet" not in message
