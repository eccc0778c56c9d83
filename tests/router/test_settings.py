"""Settings and replica readings refuse bad values naming the field and the value."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from batchd.api.environment import SettingsError
from batchd.router.loads import Loads, parse_load
from batchd.router.rbac import cluster_rbac_rules, rbac_rules, role
from batchd.router.settings import RouterSettings
from batchd.testing.schemas import validate_builtin


def test_a_bad_variable_is_named_with_its_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHD_HOLD_TIMEOUT_S", "-1")
    with pytest.raises(SettingsError, match=r"BATCHD_HOLD_TIMEOUT_S: .* \(got '-1'\)"):
        RouterSettings.from_env()


def test_namespaces_are_comma_separated_and_defaults_listen_on_loopback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BATCHD_NAMESPACES", "a, b,")
    settings = RouterSettings.from_env()
    assert settings.namespaces == ("a", "b")
    assert settings.host == "127.0.0.1"


def test_a_replica_load_reading_counts_queued_and_running_items() -> None:
    body = b'{"ready": true, "queued_items": 3, "running_items": 4, "inflight_requests": 2}'
    assert parse_load(body) == (7, True)
    assert parse_load(b'{"ready": false, "queued_items": 0, "running_items": 0}') == (0, False)
    with pytest.raises(ValueError, match="queued_items: expected a count, got 'x'"):
        parse_load(b'{"queued_items": "x", "running_items": 0}')


def test_a_replica_that_said_it_is_not_ready_is_not_ready_until_it_says_otherwise() -> None:
    loads = Loads()
    assert loads.ready("r")
    loads.begin("r")
    loads.record("r", items=5, ready=False)
    assert not loads.ready("r")
    assert loads.items("r") == 5
    loads.end("r")
    assert loads.items("r") == 4


def test_the_router_may_only_list_and_watch_its_three_kinds_and_review_tokens() -> None:
    assert rbac_rules() == [
        {
            "apiGroups": ["serving.batchd.dev"],
            "resources": ["batcheddeployments"],
            "verbs": ["list", "watch"],
        },
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["list", "watch"]},
    ]
    assert cluster_rbac_rules() == [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
        {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
    ]
    assert role("batchd-router")["kind"] == "ClusterRole"
    assert role("batchd-router", "ml")["kind"] == "Role"
    for manifest in (role("batchd-router"), role("batchd-router", "ml")):
        assert validate_builtin(manifest) == []


def test_the_router_refuses_to_start_on_a_bad_setting_naming_it() -> None:
    done = subprocess.run(
        [str(Path(sys.executable).with_name("batchd-router"))],  # the console script
        env={**os.environ, "BATCHD_MAX_HELD_PER_DEPLOYMENT": "many"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "BATCHD_MAX_HELD_PER_DEPLOYMENT: " in done.stderr
    assert "(got 'many')" in done.stderr
