"""One test run per cluster slot on a machine: a second run asking for a slot in use fails at once,
naming who holds it, instead of sharing the slot's addresses and removing them from under the first."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from batchd.testing import ROOT
from batchd.testing.kubernetes.network import (
    ClusterAddresses,
    SlotInUse,
    add_cluster_address,
    claim_slot,
    remove_cluster_address,
)
from batchd.testing.kubernetes.processes import run

UNUSED = ClusterAddresses(99)  # no worker or benchmark takes it: this test never meets a real cluster


def test_a_slot_held_by_one_run_is_refused_to_another_until_released() -> None:
    held = claim_slot(UNUSED)
    try:
        with pytest.raises(
            SlotInUse,
            match=rf"cluster slot 99 \(198\.18\.250\.100\) is in use by another test run on this machine "
            rf"\(pid {os.getpid()}, since ",
        ):
            claim_slot(UNUSED)
    finally:
        held.close()
    claim_slot(UNUSED).close()  # free again once released


def test_a_slots_address_is_added_beside_a_longer_one_it_is_the_start_of() -> None:
    longer, shorter = UNUSED, ClusterAddresses(9)  # 198.18.250.100, then 198.18.250.10
    claims = [claim_slot(longer), claim_slot(shorter)]
    try:
        add_cluster_address(longer)
        add_cluster_address(shorter)
        on_loopback = run(["ip", "-o", "addr", "show", "dev", "lo"]).stdout.split()
        assert {"198.18.250.100/32", "198.18.250.10/32"} <= set(on_loopback)
    finally:
        remove_cluster_address(shorter)
        remove_cluster_address(longer)
        for claim in claims:
            claim.close()


def test_a_run_in_a_network_namespace_of_its_own_shares_no_slot_with_the_machine() -> None:
    held = claim_slot(UNUSED)
    try:
        claim = (
            "from batchd.testing.kubernetes.network import ClusterAddresses, claim_slot; "
            "claim_slot(ClusterAddresses(99))"
        )
        inside = subprocess.run(
            [str(ROOT / "tools" / "own-network.sh"), sys.executable, "-c", claim],
            capture_output=True,
            text=True,
        )
        assert inside.returncode == 0, inside.stderr
    finally:
        held.close()
