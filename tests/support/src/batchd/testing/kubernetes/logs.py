"""What the operator and the router logged, read as a user reading their logs would: a traceback or
an RBAC refusal in either is a bug, and the tests fail on it (`tests/conftest.py`).

Both are read where a user reads them: the processes a test runs in place of the chart's pods
(their own log files), and the chart's pods (their logs as the kubelet wrote them, through the API
server). Each check reads what was written since the last one, so a problem is blamed on the test
during which it was logged.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from batchd.api.kube_connection import resource_path
from batchd.api.pod import COMPONENT_LABEL, INSTANCE_LABEL

TRACEBACK = "Traceback (most recent call last)"
# The API server's words for an RBAC refusal, as the components log the Status it answered.
RBAC_REFUSAL = re.compile(r"is forbidden: User \"[^\"]+\" cannot")
COMPONENTS = ("operator", "router")
CONTEXT_LINES = 12  # of a traceback: enough to see where it was raised and what was raised


def problems(text: str, source: str) -> list[str]:
    """The tracebacks (each with the lines that follow it) and RBAC refusals in a log's `text`."""
    lines = text.splitlines()
    found = []
    for number, line in enumerate(lines):
        if TRACEBACK in line:
            found.append(f"{source}: " + "\n    ".join(lines[number : number + CONTEXT_LINES]))
        elif RBAC_REFUSAL.search(line):
            found.append(f"{source}: {line.strip()}")
    return found


@dataclass
class ComponentLogs:
    """One release's operator and router logs, and how far each was read."""

    api: httpx.Client | None  # None: only log files (a component run with no release)
    namespace: str = ""
    release: str = ""
    files: list[Path] = field(default_factory=list)
    _read: dict[str, int] = field(default_factory=dict)  # source -> characters already checked

    def follow(self, path: Path) -> None:
        """A log file of a component run as a process in place of its pods."""
        self.files.append(path)

    def new_problems(self) -> list[str]:
        """What the operator and the router logged since the last call that is a problem."""
        found = []
        for path in self.files:
            if path.exists():
                found += self._since(str(path), path.read_text(errors="replace"))
        for pod in self._pods():
            found += self._since(f"pod {pod}", self._pod_log(pod))
        return found

    def _since(self, source: str, text: str) -> list[str]:
        start = self._read.get(source, 0)
        if len(text) < start:
            start = 0  # a new container: its log starts again
        self._read[source] = len(text)
        return problems(text[start:], source)

    def _pods(self) -> list[str]:
        if self.api is None:
            return []
        selector = f"{INSTANCE_LABEL}={self.release},{COMPONENT_LABEL} in ({','.join(COMPONENTS)})"
        response = self.api.get(
            resource_path("v1", "pods", self.namespace), params={"labelSelector": selector}
        )
        if response.status_code == 404:
            return []
        response.raise_for_status()
        return [str(item["metadata"]["name"]) for item in response.json()["items"]]

    def _pod_log(self, pod: str) -> str:
        """The pod's log as the kubelet keeps it; nothing when it has none yet (still starting)."""
        assert self.api is not None
        response = self.api.get(resource_path("v1", "pods", self.namespace, pod) + "/log")
        return response.text if response.status_code == 200 else ""


# The components running now: the check after each test reads each one's logs.
WATCHED: list[ComponentLogs] = []


def check_watched() -> list[str]:
    """The problems logged since the last check by every component running now."""
    return [problem for logs in WATCHED for problem in logs.new_problems()]


@contextlib.contextmanager
def watched(logs: ComponentLogs) -> Iterator[ComponentLogs]:
    """Check `logs` after each test while this lasts, and once more as it ends: a problem then
    fails the fixture that ran the components."""
    WATCHED.append(logs)
    try:
        yield logs
    finally:
        WATCHED.remove(logs)
    found = logs.new_problems()
    assert not found, "the operator's or the router's log shows:\n" + "\n".join(found)
