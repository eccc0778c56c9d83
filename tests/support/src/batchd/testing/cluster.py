"""A stand-in for the parts of a one-node cluster that run pods, over the emulated API server.

The emulated API server (`apiserver`) stores the Deployment the operator makes; nothing there runs
it. `Cluster` does, so that end-to-end tests drive the real operator, real replica processes and
real load together:
- the Deployment controller keeps `spec.replicas` Pods per Deployment, named and labelled as the
  ReplicaSet controller names them (`<deployment>-<pod-template-hash>-<random>`), replaces them
  all at once when the template changes (rolling updates are left to the real cluster, whose tests
  are the only ones that change a running deployment's template), scales down in the ReplicaSet
  controller's order (not ready first, then lower
  `controller.kubernetes.io/pod-deletion-cost`, then newer first), and writes the Deployment's
  status through `/status`;
- the kubelet runs each Pod's container as a real process on the Pod's own loopback address
  (127.0.0.2, 127.0.0.3, ...: in a cluster every pod has its own network namespace, here they share
  the host's, so `--host` becomes the pod's address), projects ConfigMap volumes as its AtomicWriter
  does and re-projects them when the ConfigMap changes, reports readiness from the real readiness
  probe, restarts a container that exits, and stops a deleted Pod as a kubelet does: unready at
  once, the preStop sleep, SIGTERM, SIGKILL after the grace period, then the final DELETE;
- the EndpointSlice controller keeps each Service's EndpointSlices (`batchd.testing.endpointslices`
  decides what they hold) up to date with its pods, round by round, when the emulator serves them;
- `endpoints()` are the URLs kube-proxy would route a Service to: ready, not terminating pods;
- a Service's DNS name (`name.namespace.svc.cluster.local`) in a container's env resolves to a
  ClusterIP stand-in: a loopback address of its own where a proxy sends each new connection to
  the Service's next ready endpoint, as kube-proxy does (so one replica calls another, by the
  Service URL the operator gave it: model composition).
Reads come from the emulator's storage (strongly consistent, polled every `sync_period_s`); every
write is an HTTP request to the API server, so watch events reach Kopf as in a cluster. The
components send the User-Agents of the kube-controller-manager and the kubelet, which the
emulator records apart from the operator's calls.

Not emulated: scheduling (pods are created bound to the one node), ReplicaSet objects and revision
history, liveness and startup probe kills, exec and tcpSocket probes (such a container counts as
ready once running), preStop hooks other than `sleep`, resource limits, read-only mounts, DNS
(only Service names in env values resolve: the stand-in rewrites them as a pod starts), images
(every container runs this checkout's `batchd`; the replica image's ENTRYPOINT and CMD stand in for
a missing `command` or `args`), and volumes other than configMap and emptyDir (an empty directory).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import datetime
import fcntl
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import aiohttp

from batchd.api.pod import CONFIG_PATH, REPLICA_PORT
from batchd.testing import ROOT
from batchd.testing.apiserver import ApiServer
from batchd.testing.endpointslices import ENDPOINT_SLICES, desired_slices, managed_slices, slice_changes
from batchd.testing.pods import is_finished, is_ready, is_terminating

Manifest = dict[str, Any]

NODE_NAME = "stand-in-node"
HOST_IP = "127.0.0.1"
TEMPLATE_HASH_LABEL = "pod-template-hash"
DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
CONTROLLER_AGENT = "kube-controller-manager/stand-in"
KUBELET_AGENT = "kubelet/stand-in"
# The replica image's ENTRYPOINT and CMD (Dockerfile), for a container that does not set them.
IMAGE_ENTRYPOINT = ["batchd"]
IMAGE_CMD = ["serve", CONFIG_PATH, "--host", "0.0.0.0", "--port", str(REPLICA_PORT)]
# Kubernetes' alphabet for generated names and hashes: no vowels, nothing that reads as a word.
SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
# The kubelet's minimumGracePeriodInSeconds: SIGTERM always gets this long, even after a long preStop.
MIN_GRACE_AFTER_PRESTOP_S = 2.0
# Loopback addresses tried for a pod before giving up (an address whose ports are taken is skipped).
ADDRESS_SEARCH = 4096
# Taken while an address is claimed, by every stand-in cluster on the machine (`_claiming`).
CLAIM_LOCK_PATH = Path(tempfile.gettempdir()) / "batchd-stand-in-addresses.lock"
CLUSTER_DOMAIN = "cluster.local"
# A Service's DNS name in a URL (`http://minilm.default.svc.cluster.local:8000`), port optional.
SERVICE_HOST = re.compile(
    r"\b(?P<name>[a-z0-9]([-a-z0-9]*[a-z0-9])?)\.(?P<namespace>[a-z0-9]([-a-z0-9]*[a-z0-9])?)"
    rf"\.svc\.{re.escape(CLUSTER_DOMAIN)}(:(?P<port>\d+))?"
)
API_TIMEOUT = aiohttp.ClientTimeout(total=10)


class ApiError(RuntimeError):
    """The API server refused a write of the stand-in's; controllers retry on the next round."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _fnv1a32(data: bytes) -> int:
    value = 0x811C9DC5
    for byte in data:
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return value


def template_hash(template: Manifest) -> str:
    """The `pod-template-hash` label: FNV-1a of the template, spelt with Kubernetes' safe alphabet."""
    digits = str(_fnv1a32(json.dumps(template, sort_keys=True).encode()))
    return "".join(SAFE_ALPHABET[ord(digit) % len(SAFE_ALPHABET)] for digit in digits)


def deletion_cost(pod: Manifest) -> int:
    """`controller.kubernetes.io/pod-deletion-cost`; 0 when absent or not an integer, as in the controller."""
    value = (pod["metadata"].get("annotations") or {}).get(DELETION_COST_ANNOTATION, "0")
    try:
        return int(value)
    except ValueError:
        return 0


def _owned_by(pod: Manifest, owner_uid: str) -> bool:
    return any(ref.get("uid") == owner_uid for ref in pod["metadata"].get("ownerReferences") or [])


def _scaled_value(value: int | str, total: int, *, round_up: bool) -> int:
    """maxSurge / maxUnavailable: an integer, or a percentage of the desired replicas."""
    if isinstance(value, int):
        return value
    percent = int(str(value).rstrip("%"))
    scaled = total * percent / 100
    return math.ceil(scaled) if round_up else math.floor(scaled)


def rolling_bounds(strategy: Manifest, desired: int) -> tuple[int, int]:
    """(maxSurge, maxUnavailable) resolved for `desired` replicas; both 0 would never move, so 0/1."""
    rolling = strategy.get("rollingUpdate") or {}
    surge = _scaled_value(rolling.get("maxSurge", "25%"), desired, round_up=True)
    unavailable = _scaled_value(rolling.get("maxUnavailable", "25%"), desired, round_up=False)
    return (surge, 1) if surge == 0 and unavailable == 0 else (surge, unavailable)


def project(directory: Path, files: Mapping[str, bytes], mode: int = 0o644) -> bool:
    """Write `files` (relative path -> content) into `directory` as the kubelet's AtomicWriter does.

    The files live in a timestamped directory `..<time>.<random>`; `..data` is a symlink to it and
    each top-level name a symlink into `..data`. An update writes a new timestamped directory and
    swaps `..data` by rename, so a reader sees the old set or the new one, never a mix. Returns
    False (and changes nothing) when the content is already what is projected.
    """
    directory.mkdir(parents=True, exist_ok=True)
    data_link = directory / "..data"
    old_target = os.readlink(data_link) if data_link.is_symlink() else None
    if old_target is not None and _projected(directory / old_target) == dict(files):
        return False
    stamp = datetime.datetime.now(datetime.UTC).strftime("..%Y_%m_%d_%H_%M_%S.")
    new_dir = Path(tempfile.mkdtemp(prefix=stamp, dir=directory))
    for relative, content in files.items():
        path = new_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        path.chmod(mode)
    new_dir.chmod(0o755)
    staging = directory / "..data_tmp"
    staging.unlink(missing_ok=True)
    staging.symlink_to(new_dir.name)
    os.replace(staging, data_link)  # the atomic swap
    visible = {relative.split("/", 1)[0] for relative in files}
    for name in visible:
        link = directory / name
        if not link.is_symlink():
            link.symlink_to(f"..data/{name}")
    for entry in directory.iterdir():
        if entry.name.startswith(".."):
            continue
        if entry.is_symlink() and entry.name not in visible:
            entry.unlink()  # a key that is gone
    if old_target is not None:
        shutil.rmtree(directory / old_target, ignore_errors=True)
    return True


def _projected(directory: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(directory)): path.read_bytes() for path in directory.rglob("*") if path.is_file()
    }


def _config_map_files(config_map: Manifest, source: Manifest) -> dict[str, bytes]:
    """The files a configMap volume shows: every key, or only `items` at their paths."""
    data = {key: value.encode() for key, value in (config_map.get("data") or {}).items()}
    data.update({key: base64.b64decode(value) for key, value in (config_map.get("binaryData") or {}).items()})
    items = source.get("items")
    if not items:
        return data
    return {item["path"]: data[item["key"]] for item in items if item["key"] in data}


def _reserve(ip: str, ports: Iterable[int]) -> list[socket.socket] | None:
    """Hold `ip:port` for each port, or None if any is taken (by anything, on this machine).

    The check binds without SO_REUSEADDR, so it fails on any socket bound there; the reservation
    binds with it and never listens, so the replica (uvicorn sets SO_REUSEADDR) can still bind while
    other test sessions on the machine see the address as taken.
    """
    held: list[socket.socket] = []
    try:
        for port in ports:
            with socket.socket() as probe:
                probe.bind((ip, port))
            reservation = socket.socket()
            held.append(reservation)
            reservation.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            reservation.bind((ip, port))
    except OSError:
        for reservation in held:
            reservation.close()
        return None
    return held


@contextlib.contextmanager
def _claiming() -> Iterator[None]:
    """Hold the machine-wide lock on claiming loopback addresses.

    `_reserve` checks, then holds: two stand-in clusters in other processes (the suite's parallel
    workers) checking the same free address at once would both hold it, and their pods would share
    an IP. Under this lock the check and the hold are one step for every stand-in on the machine.
    """
    with open(CLAIM_LOCK_PATH, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


async def _wait_for(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait `timeout_s`, or less if `event` is set (a pod deleted mid-period); True if it was."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()
    return event.is_set()


def _condition(previous: Manifest, type_: str, status: str, reason: str, message: str) -> Manifest:
    """A Deployment condition; its times move only when it changes (no write without a change)."""
    now = _now()
    same = (previous.get("status"), previous.get("reason"), previous.get("message")) == (
        status,
        reason,
        message,
    )
    moved = previous.get("status") != status
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastUpdateTime": previous.get("lastUpdateTime", now) if same else now,
        "lastTransitionTime": now if moved else previous.get("lastTransitionTime", now),
    }


def deployment_status(
    deployment: Manifest, live: list[Manifest], current: str, *, stalled: bool = False
) -> Manifest:
    """What the Deployment controller reports for these live (not terminating) pods.

    Counts exclude terminating pods, as ReplicaSets count only active ones; available = ready
    (minReadySeconds is 0); `stalled` = no progress within progressDeadlineSeconds.
    """
    meta, spec = deployment["metadata"], deployment["spec"]
    desired = int(spec.get("replicas", 1))
    ready = sum(is_ready(pod) for pod in live)
    updated = sum(_hash_of(pod) == current for pod in live)
    _, unavailable = rolling_bounds(spec.get("strategy") or {}, desired)
    replica_set = f'ReplicaSet "{meta["name"]}-{current}"'
    if updated == desired == len(live) == ready:
        progressing = ("True", "NewReplicaSetAvailable", f"{replica_set} has successfully progressed.")
    elif stalled:
        progressing = ("False", "ProgressDeadlineExceeded", f"{replica_set} has timed out progressing.")
    else:
        progressing = ("True", "ReplicaSetUpdated", f"{replica_set} is progressing.")
    if ready >= desired - unavailable:
        available = ("True", "MinimumReplicasAvailable", "Deployment has minimum availability.")
    else:
        available = ("False", "MinimumReplicasUnavailable", "Deployment does not have minimum availability.")
    previous = {item.get("type"): item for item in (deployment.get("status") or {}).get("conditions") or []}
    counts = {
        "replicas": len(live),
        "updatedReplicas": updated,
        "readyReplicas": ready,
        "availableReplicas": ready,
        "unavailableReplicas": max(0, desired - ready),
    }
    return {
        "observedGeneration": meta.get("generation", 1),
        # Zero counts are left out, as the API server's JSON leaves out empty fields.
        **{key: value for key, value in counts.items() if value},
        "conditions": [
            _condition(previous.get("Available", {}), "Available", *available),
            _condition(previous.get("Progressing", {}), "Progressing", *progressing),
        ],
    }


@dataclass(frozen=True)
class PodView:
    """One Pod as a test sees it: the API's view joined with the process that runs it."""

    namespace: str
    name: str
    ip: str | None
    port: int | None
    ready: bool
    terminating: bool
    deletion_cost: int
    restarts: int
    pid: int | None
    template_hash: str

    @property
    def url(self) -> str:
        return f"http://{self.ip}:{self.port}"


class _Pod:
    """The kubelet's side of one Pod: its sandbox (address, directories), container process and status."""

    def __init__(self, cluster: Cluster, pod: Manifest, ip: str, reservations: list[socket.socket]) -> None:
        self.cluster = cluster
        self.pod = pod
        meta = pod["metadata"]
        self.namespace, self.name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.path = f"/api/v1/namespaces/{self.namespace}/pods/{self.name}"
        self.ip = ip
        self.reservations = reservations
        self.directory = cluster.workdir / "pods" / f"{self.namespace}.{self.name}"
        self.log_path = self.directory / "container.log"
        containers = pod["spec"].get("containers") or [{}]
        self.container: Manifest = containers[0]
        self.process: subprocess.Popen[bytes] | None = None
        self.exit_codes: list[int] = []
        self.restarts = 0
        self.ready = False
        self.done = False  # stopped for good
        self.gone = False  # removed from the API without the kubelet's confirmation
        self.waiting = ("ContainerCreating", "")
        self.started_at: str | None = None
        self.start_time = _now()
        self.last_state: Manifest = {}
        self.terminating = asyncio.Event()
        self.volumes: dict[str, Path] = {}
        self._transitions: dict[str, tuple[str, str]] = {}
        self._reported: Manifest | None = None
        self.task: asyncio.Task[None] | None = None
        if len(containers) > 1:
            self.waiting = ("CreateContainerConfigError", "the stand-in kubelet runs one container per pod")

    # -- what tests see ------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def ports(self) -> dict[str, int]:
        return {
            str(port.get("name", port["containerPort"])): int(port["containerPort"])
            for port in self.container.get("ports") or []
        }

    def port_of(self, port: int | str | None) -> int | None:
        """A numeric or named container port; None = the first one."""
        if isinstance(port, int):
            return port
        ports = self.ports()
        if port is None:
            return next(iter(ports.values()), None)
        return ports.get(port, int(port) if str(port).isdigit() else None)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def host_path(self, container_path: str) -> str:
        """Where a path inside the container lies on this machine (its mounts); unmounted paths stay."""
        for mount in sorted(
            self.container.get("volumeMounts") or [], key=lambda item: len(item["mountPath"]), reverse=True
        ):
            root = mount["mountPath"].rstrip("/")
            if container_path == root or container_path.startswith(root + "/"):
                host = self.volumes.get(mount["name"], self.directory / "volumes" / mount["name"])
                host = host / mount.get("subPath", "")
                return str(host) + container_path[len(root) :]
        return container_path

    # -- volumes ---------------------------------------------------------------------------------------
    def mount_volumes(self) -> bool:
        """Set up every volume; False while a ConfigMap it needs does not exist (FailedMount)."""
        for volume in self.pod["spec"].get("volumes") or []:
            host = self.directory / "volumes" / volume["name"]
            if "configMap" in volume and not self._project(volume["configMap"], host):
                return False
            host.mkdir(parents=True, exist_ok=True)
            self.volumes[volume["name"]] = host
        return True

    def refresh_config_maps(self) -> None:
        """The kubelet's periodic sync: project the current content of every mounted ConfigMap."""
        for volume in self.pod["spec"].get("volumes") or []:
            if "configMap" in volume and volume["name"] in self.volumes:
                self._project(volume["configMap"], self.volumes[volume["name"]])

    def _project(self, source: Manifest, host: Path) -> bool:
        config_map = self.cluster.server.get_object("configmaps", self.namespace, source.get("name", ""))
        if config_map is None and not source.get("optional"):
            return False
        files = _config_map_files(config_map or {}, source)
        project(host, files, int(source.get("defaultMode", 0o644)))
        return True

    # -- the container ----------------------------------------------------------------------------------
    def _expand(self, value: str, env: Mapping[str, str]) -> str:
        """`$(VAR)` from the container's env, as the kubelet expands command, args and env values."""
        return re.sub(
            r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
            lambda match: "$" if match.group(0) == "$$" else env.get(match.group(1), match.group(0)),
            value,
        )

    def _field(self, path: str) -> str | None:
        """The downward API's fieldRef values that need no node."""
        meta = self.pod["metadata"]
        simple: dict[str, str] = {
            "metadata.name": self.name,
            "metadata.namespace": self.namespace,
            "metadata.uid": self.uid,
            "spec.nodeName": NODE_NAME,
            "spec.serviceAccountName": str(self.pod["spec"].get("serviceAccountName", "default")),
            "status.podIP": self.ip,
            "status.hostIP": HOST_IP,
        }
        if path in simple:
            return simple[path]
        match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
        value = (meta.get(match.group(1)) or {}).get(match.group(2)) if match else None
        return None if value is None else str(value)

    def environment(self) -> dict[str, str]:
        """The container's env (values mapped onto its mounts) over this process's (PATH and the like)."""
        own: dict[str, str] = {"HOSTNAME": self.name}
        for item in self.container.get("env") or []:
            if "value" in item:
                resolved = self.cluster.resolve_services(self._expand(str(item["value"]), own))
                own[item["name"]] = self.host_path(resolved)
            elif "fieldRef" in (item.get("valueFrom") or {}):
                value = self._field(item["valueFrom"]["fieldRef"].get("fieldPath", ""))
                if value is not None:
                    own[item["name"]] = value
        return {**os.environ, "PYTHONUNBUFFERED": "1", **own}

    def argv(self, env: Mapping[str, str]) -> list[str]:
        """command + args with `$(VAR)` expanded, paths mapped onto the mounts, `--host` the pod's own."""
        command = list(self.container.get("command") or IMAGE_ENTRYPOINT)
        args = list(self.container.get("args") or ([] if self.container.get("command") else IMAGE_CMD))
        words = [self._expand(word, env) for word in [*command, *args]]
        beside = Path(sys.executable).with_name(words[0])
        words[0] = str(beside) if "/" not in words[0] and beside.exists() else words[0]
        result: list[str] = []
        for index, word in enumerate(words):
            if index > 0 and words[index - 1] == "--host":
                result.append(self.ip)
            elif word.startswith("--host="):
                result.append(f"--host={self.ip}")
            else:
                result.append(self.host_path(word) if index > 0 else word)
        return result

    def start(self) -> bool:
        """Start the container; False (a StartError, exit code 128, as the runtime reports) if it cannot."""
        env = self.environment()
        argv = self.argv(env)
        self.started_at = _now()
        with self.log_path.open("ab") as log:
            log.write(f"--- stand-in kubelet: starting (restart {self.restarts}): {argv}\n".encode())
            log.flush()
            try:
                self.process = subprocess.Popen(
                    argv,
                    cwd=ROOT,  # handlers such as examples.adder import from here, as from /app in the image
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group: SIGKILL takes the whole container
                )
            except OSError as error:
                log.write(f"--- stand-in kubelet: cannot start: {error}\n".encode())
                self.exit_codes.append(128)
                self.last_state = {
                    "terminated": {"exitCode": 128, "reason": "StartError", "message": str(error)}
                }
                return False
        self.waiting = ("", "")
        return True

    def record_exit(self) -> None:
        """The container stopped: keep its exit code as Kubernetes reports it (128 + signal)."""
        assert self.process is not None and self.process.returncode is not None
        code = self.process.returncode
        code = 128 - code if code < 0 else code
        self.exit_codes.append(code)
        self.last_state = {
            "terminated": {
                "exitCode": code,
                "reason": "Completed" if code == 0 else "Error",
                "startedAt": self.started_at,
                "finishedAt": _now(),
            }
        }
        self.process = None
        self.ready = False

    async def wait_exit(self, deadline: float) -> bool:
        while self.process is not None and self.process.poll() is None:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)

    async def probe(self, session: aiohttp.ClientSession) -> bool:
        """The readiness probe's httpGet against the container; a container without one is ready."""
        get = (self.container.get("readinessProbe") or {}).get("httpGet")
        if get is None:
            return True
        url = f"http://{get.get('host', self.ip)}:{self.port_of(get.get('port'))}{get.get('path', '/')}"
        # The manifest's timeout, as the kubelet takes it (default 1 s): the stand-in probes every
        # `probe_period_s`, far more often than the manifest's period, so a capped timeout made two
        # slow answers from a busy replica on this shared CPU read as an unready pod.
        timeout = float(self.container["readinessProbe"].get("timeoutSeconds", 1))
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as response:
                return 200 <= response.status < 400
        except (aiohttp.ClientError, TimeoutError):
            return False

    # -- status -----------------------------------------------------------------------------------------
    def _condition(self, type_: str, ok: bool) -> Manifest:
        status = "True" if ok else "False"
        before = self._transitions.get(type_)
        if before is None or before[0] != status:
            self._transitions[type_] = (status, _now())
        return {"type": type_, "status": status, "lastTransitionTime": self._transitions[type_][1]}

    def status(self) -> Manifest:
        if self.done:
            code = self.exit_codes[-1] if self.exit_codes else 0
            phase, state = ("Succeeded" if code == 0 else "Failed"), self.last_state
        elif self.running:
            phase, state = "Running", {"running": {"startedAt": self.started_at}}
        else:
            reason, message = self.waiting
            phase = "Running" if self.exit_codes else "Pending"
            state = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
        container_status: Manifest = {
            "name": self.container.get("name", ""),
            "image": self.container.get("image", ""),
            "imageID": "",
            "ready": self.ready,
            "started": self.running,
            "restartCount": self.restarts,
            "state": state,
        }
        if self.process is not None:
            container_status["containerID"] = f"stand-in://{self.process.pid}"
        if self.last_state and not self.done:
            container_status["lastState"] = self.last_state
        return {
            "phase": phase,
            "hostIP": HOST_IP,
            "hostIPs": [{"ip": HOST_IP}],
            "podIP": self.ip,
            "podIPs": [{"ip": self.ip}],
            "startTime": self.start_time,
            "qosClass": "BestEffort",
            "conditions": [
                self._condition("PodScheduled", True),
                self._condition("Initialized", True),
                self._condition("ContainersReady", self.ready),
                self._condition("Ready", self.ready),
            ],
            "containerStatuses": [container_status],
        }

    async def report(self) -> None:
        """Write the status through `/status` when it changed, as the kubelet's status manager does."""
        if self.gone:
            return
        status = self.status()
        if status == self._reported:
            return
        body = [{"op": "add", "path": "/status", "value": status}]
        await self.cluster.call(KUBELET_AGENT, "PATCH", f"{self.path}/status", body, missing_ok=True)
        self._reported = status

    # -- lifecycle --------------------------------------------------------------------------------------
    async def run(self) -> None:
        cluster = self.cluster
        self.directory.mkdir(parents=True, exist_ok=True)
        await self.report()
        mounted = False
        while not self.terminating.is_set() and not self.waiting[0].startswith("CreateContainer"):
            mounted = mounted or self.mount_volumes()
            if not mounted:
                self.waiting = ("ContainerCreating", "waiting for a ConfigMap volume")
                await self.report()
                await _wait_for(self.terminating, cluster.config_sync_period_s)
                continue
            if self.start():
                await self._watch_container()
                if self.terminating.is_set():
                    break
                self.record_exit()  # it stopped by itself: restartPolicy decides
            policy = self.pod["spec"].get("restartPolicy", "Always")
            if policy == "Never" or (policy == "OnFailure" and self.exit_codes[-1] == 0):
                break
            self.waiting = ("CrashLoopBackOff", "back-off restarting the failed container")
            await self.report()
            if await _wait_for(self.terminating, cluster.restart_backoff_s * 2 ** min(self.restarts, 5)):
                break
            self.restarts += 1
        if not self.terminating.is_set():
            self.done = True
            await self.report()  # finished for good (restartPolicy): the pod stays, terminal
            await self.terminating.wait()
        await self.terminate()

    async def _watch_container(self) -> None:
        """Probe readiness every probe period until the container exits or the pod is deleted."""
        probe = self.container.get("readinessProbe") or {}
        threshold = int(probe.get("failureThreshold", 3))
        failures = 0
        while not self.terminating.is_set() and self.running:
            if await self.probe(self.cluster.probes):
                self.ready, failures = True, 0
            else:
                failures += 1
                self.ready = self.ready and failures < threshold
            self.ready = self.ready and self.running and not self.terminating.is_set()
            await self.report()
            await _wait_for(self.terminating, self.cluster.probe_period_s)

    async def terminate(self) -> None:
        """Graceful stop: unready at once (endpoints drop it), preStop, SIGTERM, SIGKILL at the deadline."""
        self.ready = False
        await self.report()
        meta, spec = self.pod["metadata"], self.pod["spec"]
        grace = float(meta.get("deletionGracePeriodSeconds", spec.get("terminationGracePeriodSeconds", 30)))
        began = time.monotonic()
        if self.running:
            pre_stop = ((self.container.get("lifecycle") or {}).get("preStop") or {}).get("sleep") or {}
            if pre_stop.get("seconds"):
                await asyncio.sleep(min(float(pre_stop["seconds"]), grace))  # the hook itself is a sleep
        if self.running:
            assert self.process is not None
            self.process.send_signal(signal.SIGTERM)
            deadline = max(began + grace, time.monotonic() + MIN_GRACE_AFTER_PRESTOP_S)
            if not await self.wait_exit(deadline):
                self.kill()
                await self.wait_exit(time.monotonic() + 10)
        if self.process is not None:
            self.record_exit()
        self.done = True
        await self.report()
        if not self.gone:  # the kubelet's confirmation: the Pod object goes now
            params = {"gracePeriodSeconds": "0"}
            await self.cluster.call(KUBELET_AGENT, "DELETE", self.path, params=params, missing_ok=True)
        self.release()

    def release(self) -> None:
        for reservation in self.reservations:
            reservation.close()
        self.reservations = []


class Cluster:
    """Deployment and EndpointSlice controllers, kubelet and kube-proxy for the emulated API server's pods.

    `async with Cluster(server, tmp_path) as cluster:` starts them as tasks in the current loop; on
    exit every process is stopped and waited for (SIGTERM, then SIGKILL), every task is done, and
    an exception leaving the block carries each pod's state and log tail as a note.
    """

    def __init__(
        self,
        server: ApiServer,
        workdir: Path,
        *,
        sync_period_s: float = 0.05,
        probe_period_s: float = 0.2,
        config_sync_period_s: float = 0.5,
        restart_backoff_s: float = 0.5,
        stop_timeout_s: float = 10.0,
    ) -> None:
        self.server = server
        self.workdir = workdir
        self.sync_period_s = sync_period_s  # how often controllers and the kubelet look at the API
        self.probe_period_s = probe_period_s  # readiness probes (the manifests' periods are for clusters)
        self.config_sync_period_s = config_sync_period_s  # ConfigMap changes reach pods within this
        self.restart_backoff_s = restart_backoff_s  # CrashLoopBackOff: this, doubling (a kubelet: 10 s)
        self.stop_timeout_s = stop_timeout_s  # on exit: SIGTERM, then SIGKILL after this long
        self.api_errors: list[str] = []  # refused writes, retried; shown by describe()
        self._pods: dict[str, _Pod] = {}  # by uid, kept after the pod goes (logs, exit codes)
        self._created: dict[str, int] = {}  # pod uid -> creation order, to rank equal timestamps
        self._progress: dict[str, tuple[tuple[Any, ...], float]] = {}  # deployment uid -> progress
        self._next_address = 2
        self._services: dict[tuple[str, str, int], _ServiceProxy] = {}  # (namespace, name, port)
        self._url = str(server.url).rstrip("/")
        self._api: aiohttp.ClientSession | None = None
        self.probes: aiohttp.ClientSession  # a fresh connection per probe, as the kubelet's
        self._task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._slices_served = True  # whether the emulator serves EndpointSlices (set on entry)

    # -- lifecycle --------------------------------------------------------------------------------------
    async def __aenter__(self) -> Self:
        self.server.known_by_plural("pods")  # KeyError: the emulator was not taught pods
        try:
            self.server.known_by_plural(ENDPOINT_SLICES)
        except KeyError:
            self._slices_served = False
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._api = aiohttp.ClientSession(timeout=API_TIMEOUT)
        self.probes = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        self._task = asyncio.create_task(self._control(), name="stand-in cluster")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is not None:
            exc.add_note(self.describe())
        try:
            await self._stop()
        finally:
            for pod in self._pods.values():  # whatever happened above: no orphans, no open sockets
                pod.kill()
                if pod.process is not None:
                    pod.process.wait(timeout=10)
                pod.release()
        if self._failure is not None and exc is None:
            raise RuntimeError(f"the stand-in cluster failed:\n{self.describe()}") from self._failure

    async def _stop(self) -> None:
        for proxy in self._services.values():
            await proxy.close()
        tasks = [
            task for task in [self._task, *(pod.task for pod in self._pods.values())] if task is not None
        ]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        running = [pod for pod in self._pods.values() if pod.running]
        for pod in running:
            assert pod.process is not None
            pod.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_s
        for pod in running:
            if not await pod.wait_exit(deadline):
                pod.kill()
                await pod.wait_exit(time.monotonic() + 10)
            if pod.process is not None and pod.process.poll() is not None:
                pod.record_exit()
        if self._api is not None:
            await self._api.close()
        await self.probes.close()

    async def _control(self) -> None:
        """Every `sync_period_s`: the Deployment controller's round, the kubelet's, the volume sync."""
        next_config_sync = 0.0
        try:
            while True:
                try:
                    for deployment in self.server.list_objects("apps/deployments"):
                        await self._sync_deployment(deployment)
                    self._sync_kubelet()
                    if self._slices_served:
                        for service in self.server.list_objects("services"):
                            await self._sync_endpoint_slices(service)
                except ApiError as error:
                    self.api_errors.append(str(error))  # retried next round, as a controller requeues
                if time.monotonic() >= next_config_sync:
                    for pod in self._pods.values():
                        if not pod.done and not pod.terminating.is_set():
                            pod.refresh_config_maps()
                    next_config_sync = time.monotonic() + self.config_sync_period_s
                await asyncio.sleep(self.sync_period_s)
        except Exception as error:
            self._failure = error
            raise

    async def call(
        self,
        agent: str,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        missing_ok: bool = False,
    ) -> Manifest | None:
        """One request to the API server as `agent`; None for a 404 when `missing_ok`."""
        assert self._api is not None
        headers = {"User-Agent": agent}
        data = None
        if body is not None:
            data = json.dumps(body)
            headers["Content-Type"] = (
                "application/json-patch+json" if method == "PATCH" else "application/json"
            )
        async with self._api.request(
            method, self._url + path, data=data, headers=headers, params=params
        ) as response:
            payload = await response.text()
            if response.status == 404 and missing_ok:
                return None
            if response.status >= 400:
                raise ApiError(response.status, f"{agent}: {method} {path}: {response.status} {payload}")
            result: Manifest = json.loads(payload) if payload else {}
            return result

    # -- the Deployment controller -----------------------------------------------------------------------
    async def _sync_deployment(self, deployment: Manifest) -> None:
        meta, spec = deployment["metadata"], deployment["spec"]
        if meta.get("deletionTimestamp"):
            return  # going: the garbage collector takes its pods
        desired = int(spec.get("replicas", 1))
        current = template_hash(spec["template"])

        def owned() -> list[Manifest]:
            pods = self.server.list_objects("pods", meta["namespace"])
            return [pod for pod in pods if _owned_by(pod, meta["uid"])]

        pods = owned()
        live = [pod for pod in pods if _is_live(pod)]
        new = [pod for pod in live if _hash_of(pod) == current]
        old = [pod for pod in live if _hash_of(pod) != current]
        # A changed template replaces every pod at once: the rolling update itself is the real
        # Deployment controller's, tested on the real cluster (tests/operator/test_restart.py).
        await self._delete_pods(old)
        await self._scale(deployment, new, desired, current)
        await self._write_status(deployment, owned(), current)

    async def _scale(self, deployment: Manifest, pods: list[Manifest], desired: int, current: str) -> None:
        for _ in range(desired - len(pods)):
            await self._create_pod(deployment, current)
        await self._delete_pods(self._ranked(pods)[: max(0, len(pods) - desired)])

    def _ranked(self, pods: list[Manifest]) -> list[Manifest]:
        """The ReplicaSet controller's order for scaling down: the first go first.

        Unscheduled before scheduled, Pending before Running, not ready before ready, lower
        pod-deletion-cost before higher, newer before older
        (https://kubernetes.io/docs/concepts/workloads/controllers/replicaset/#scaling-a-replicaset).
        """
        phases = {"Pending": 0, "Unknown": 1, "Running": 2}

        def rank(pod: Manifest) -> tuple[Any, ...]:
            meta = pod["metadata"]
            return (
                bool(pod["spec"].get("nodeName")),
                phases.get((pod.get("status") or {}).get("phase", "Pending"), 0),
                is_ready(pod),
                deletion_cost(pod),
                -_seconds(meta.get("creationTimestamp", "")),
                -self._created.get(meta["uid"], 0),
            )

        return sorted(pods, key=rank)

    async def _create_pod(self, deployment: Manifest, current: str) -> None:
        meta = deployment["metadata"]
        template = deployment["spec"]["template"]
        template_meta = template.get("metadata") or {}
        pod_meta: Manifest = {
            "generateName": f"{meta['name']}-{current}-",
            "namespace": meta["namespace"],
            "labels": {**(template_meta.get("labels") or {}), TEMPLATE_HASH_LABEL: current},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        }
        if template_meta.get("annotations"):
            pod_meta["annotations"] = dict(template_meta["annotations"])
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": pod_meta,
            # No scheduler: one node, and the pod is created bound to it.
            "spec": {**copy.deepcopy(template.get("spec") or {}), "nodeName": NODE_NAME},
        }
        path = f"/api/v1/namespaces/{meta['namespace']}/pods"
        created = await self.call(CONTROLLER_AGENT, "POST", path, pod)
        assert created is not None
        self._created[created["metadata"]["uid"]] = len(self._created) + 1

    async def _delete_pods(self, pods: list[Manifest]) -> None:
        for pod in pods:
            meta = pod["metadata"]
            path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
            await self.call(CONTROLLER_AGENT, "DELETE", path, missing_ok=True)

    async def _write_status(self, deployment: Manifest, pods: list[Manifest], current: str) -> None:
        meta = deployment["metadata"]
        live = [pod for pod in pods if _is_live(pod)]
        # Progress = any pod created, deleted, updated or turned ready since the last round.
        counts = (current, len(live), sum(map(is_ready, live)), sum(_hash_of(pod) == current for pod in live))
        before, since = self._progress.get(meta["uid"], ((), time.monotonic()))
        if counts != before:
            since = time.monotonic()
            self._progress[meta["uid"]] = (counts, since)
        deadline_s = float(deployment["spec"].get("progressDeadlineSeconds", 600))
        status = deployment_status(deployment, live, current, stalled=time.monotonic() - since > deadline_s)
        if status != deployment.get("status"):
            path = f"/apis/apps/v1/namespaces/{meta['namespace']}/deployments/{meta['name']}/status"
            body = [{"op": "add", "path": "/status", "value": status}]
            await self.call(CONTROLLER_AGENT, "PATCH", path, body)

    # -- the EndpointSlice controller -----------------------------------------------------------------------
    async def _sync_endpoint_slices(self, service: Manifest) -> None:
        """Write what differs between the Service's slices and what its pods say they should be."""
        meta = service["metadata"]
        if not (service.get("spec") or {}).get("selector") or meta.get("deletionTimestamp"):
            return
        namespace = meta["namespace"]
        existing = managed_slices(service, self.server.list_objects(ENDPOINT_SLICES, namespace))
        desired = desired_slices(service, self.server.list_objects("pods", namespace))
        creates, patches, deletes = slice_changes(desired, existing)
        path = f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
        for document in creates:
            await self.call(CONTROLLER_AGENT, "POST", path, document)
        for name, operations in patches:
            await self.call(CONTROLLER_AGENT, "PATCH", f"{path}/{name}", operations, missing_ok=True)
        for name in deletes:
            await self.call(CONTROLLER_AGENT, "DELETE", f"{path}/{name}", missing_ok=True)

    # -- the kubelet --------------------------------------------------------------------------------------
    def _sync_kubelet(self) -> None:
        """Start a sandbox for each new pod on this node; pass deletions to the pods' own tasks."""
        seen = set()
        for pod in self.server.list_objects("pods"):
            if pod["spec"].get("nodeName") != NODE_NAME:
                continue
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            runtime = self._pods.get(uid)
            if runtime is None:
                runtime = self._pods[uid] = self._admit(pod)
            runtime.pod = pod
            if is_terminating(pod):
                runtime.terminating.set()
        for uid, runtime in self._pods.items():
            if uid not in seen and not runtime.done:
                runtime.gone = True  # deleted without waiting for us: stop it all the same
                runtime.terminating.set()

    def _admit(self, pod: Manifest) -> _Pod:
        ports = [
            int(port["containerPort"])
            for container in pod["spec"].get("containers") or []
            for port in container.get("ports") or []
        ]
        ip, reservations = self._claim_address(ports)
        runtime = _Pod(self, pod, ip, reservations)
        runtime.task = asyncio.create_task(runtime.run(), name=f"kubelet {runtime.name}")
        runtime.task.add_done_callback(self._pod_task_done)
        return runtime

    def _claim_address(self, ports: list[int]) -> tuple[str, list[socket.socket]]:
        """A loopback address of its own (a pod's IP, or a Service's ClusterIP), its ports held."""
        with _claiming():
            for index in range(self._next_address, self._next_address + ADDRESS_SEARCH):
                if index % 256 in (0, 255):
                    continue
                ip = f"127.{(index >> 16) & 255}.{(index >> 8) & 255}.{index & 255}"
                reservations = _reserve(ip, ports)
                if reservations is not None:
                    self._next_address = index + 1
                    return ip, reservations
        raise RuntimeError(f"no free loopback address for ports {ports} in {ADDRESS_SEARCH} tries")

    # -- Services: cluster DNS and kube-proxy ---------------------------------------------------------------
    def resolve_services(self, value: str) -> str:
        """`value` with each Service DNS name in it (`name.ns.svc.cluster.local:port`) replaced by the
        address of that Service's ClusterIP stand-in, as the cluster's DNS would resolve it."""

        def address(match: re.Match[str]) -> str:
            port = int(match.group("port") or 80)
            proxy = self.service_proxy(match.group("namespace"), match.group("name"), port)
            return f"{proxy.ip}:{port}"

        return SERVICE_HOST.sub(address, value)

    def service_proxy(self, namespace: str, name: str, port: int) -> _ServiceProxy:
        """The Service's ClusterIP stand-in on `port`, made on first use: like a DNS answer, the
        address exists before the Service does, and a connection finds its endpoints when it opens."""
        key = (namespace, name, port)
        if key not in self._services:
            ip, (listener,) = self._claim_address([port])
            self._services[key] = _ServiceProxy(self, namespace, name, ip, listener)
        return self._services[key]

    def _pod_task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._failure = task.exception()

    # -- what tests use -------------------------------------------------------------------------------------
    def _runtime(self, name: str, namespace: str) -> _Pod:
        for runtime in self._pods.values():
            if (runtime.namespace, runtime.name) == (namespace, name):
                return runtime
        raise KeyError(f"no pod {namespace}/{name} ran here")

    def pods(self, deployment: str, namespace: str = "default") -> list[PodView]:
        """The Deployment's pods in the API (terminating ones too), oldest first."""
        owner = self.server.get_object("apps/deployments", namespace, deployment)
        if owner is None:
            return []
        found = [
            pod
            for pod in self.server.list_objects("pods", namespace)
            if _owned_by(pod, owner["metadata"]["uid"])
        ]
        found.sort(
            key=lambda pod: (
                pod["metadata"].get("creationTimestamp", ""),
                self._created.get(pod["metadata"]["uid"], 0),
            )
        )
        return [self._view(pod) for pod in found]

    def pod(self, name: str, namespace: str = "default") -> PodView | None:
        """One pod by name, None once it is gone from the API."""
        found = self.server.get_object("pods", namespace, name)
        return None if found is None else self._view(found)

    def _view(self, pod: Manifest) -> PodView:
        meta = pod["metadata"]
        runtime = self._pods.get(meta["uid"])
        return PodView(
            namespace=meta["namespace"],
            name=meta["name"],
            ip=(pod.get("status") or {}).get("podIP"),
            port=runtime.port_of(None) if runtime is not None else None,
            ready=is_ready(pod),
            terminating=is_terminating(pod),
            deletion_cost=deletion_cost(pod),
            restarts=runtime.restarts if runtime is not None else 0,
            pid=runtime.process.pid if runtime is not None and runtime.running and runtime.process else None,
            template_hash=_hash_of(pod),
        )

    def endpoints(self, service: str, namespace: str = "default") -> list[str]:
        """Base URLs kube-proxy would send the Service's traffic to: its ready, not terminating pods.

        Pods match the Service's selector (or, without a Service of that name, the Deployment's), on
        the Service's targetPort (a number or a container port's name).
        """
        found = self.server.get_object("services", namespace, service)
        target: int | str | None = None
        if found is not None:
            selector = found["spec"].get("selector") or {}
            ports = found["spec"].get("ports") or [{}]
            target = ports[0].get("targetPort", ports[0].get("port"))
        else:
            deployment = self.server.get_object("apps/deployments", namespace, service)
            if deployment is None:
                return []
            selector = deployment["spec"]["selector"].get("matchLabels") or {}
        urls = []
        for pod in self.server.list_objects("pods", namespace):
            labels = pod["metadata"].get("labels") or {}
            runtime = self._pods.get(pod["metadata"]["uid"])
            if not selector or any(labels.get(key) != value for key, value in selector.items()):
                continue
            if runtime is None or is_terminating(pod) or not is_ready(pod):
                continue
            urls.append(f"http://{pod['status']['podIP']}:{runtime.port_of(target)}")
        return urls

    def log(self, pod: str, namespace: str = "default") -> str:
        """Everything the pod's container wrote, across restarts; kept after the pod goes."""
        return self._runtime(pod, namespace).log()

    def exit_codes(self, pod: str, namespace: str = "default") -> list[int]:
        """Each exit of the pod's container, in order (128 + N for signal N), kept after the pod goes."""
        return list(self._runtime(pod, namespace).exit_codes)

    def host_path(self, pod: str, container_path: str, namespace: str = "default") -> Path:
        """Where a path in the pod's container (e.g. /etc/batchd/manifest.yaml) lies on this machine."""
        return Path(self._runtime(pod, namespace).host_path(container_path))

    def describe(self, log_lines: int = 20) -> str:
        """Every pod's state and the tail of its log, and refused writes: for failure messages."""
        parts = []
        for runtime in self._pods.values():
            state = (
                f"{runtime.namespace}/{runtime.name} ip={runtime.ip} ready={runtime.ready} "
                f"running={runtime.running} terminating={runtime.terminating.is_set()} "
                f"restarts={runtime.restarts} exits={runtime.exit_codes}"
            )
            tail = "\n".join("    " + line for line in runtime.log().splitlines()[-log_lines:])
            parts.append(f"  {state}\n{tail}")
        errors = "".join(f"\n  refused: {error}" for error in self.api_errors[-10:])
        if self._failure is not None:
            errors += f"\n  crashed: {self._failure!r}"
        return "stand-in cluster pods:\n" + ("\n".join(parts) or "  (none)") + errors


class _ServiceProxy:
    """kube-proxy's part for one Service port: a listener on the Service's own loopback address (its
    ClusterIP) that sends each new connection to the Service's next ready endpoint, bytes both ways.
    No endpoint, or one that refuses: the connection is closed at once, as kube-proxy rejects it."""

    def __init__(self, cluster: Cluster, namespace: str, name: str, ip: str, listener: socket.socket) -> None:
        self.cluster, self.namespace, self.name, self.ip = cluster, namespace, name, ip
        self.connections = 0  # connections made through it, for tests
        self._turn = 0
        self._open: set[asyncio.Task[Any]] = set()
        listener.listen(128)
        listener.setblocking(False)
        self._listener = listener
        self._server: asyncio.Server | None = None
        self._serving = asyncio.create_task(self._serve(), name=f"kube-proxy {namespace}/{name}")

    async def _serve(self) -> None:
        self._server = await asyncio.start_server(self._connect, sock=self._listener)
        await self._server.serve_forever()

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._open.add(task)
        try:
            urls = self.cluster.endpoints(self.name, self.namespace)
            if not urls:
                return
            url = urls[self._turn % len(urls)]
            self._turn += 1
            host, _, port = url.removeprefix("http://").rpartition(":")
            try:
                upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
            except OSError:
                return
            self.connections += 1
            try:
                await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
            finally:
                upstream_writer.close()
        finally:
            writer.close()
            self._open.discard(task)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in [self._serving, *self._open]:
            task.cancel()
        await asyncio.gather(self._serving, *self._open, return_exceptions=True)
        self._listener.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until end of stream, then pass the end on (a half-close, as TCP does)."""
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()


def _is_live(pod: Manifest) -> bool:
    """Counted by its ReplicaSet: neither terminating nor finished."""
    return not is_terminating(pod) and not is_finished(pod)


def _hash_of(pod: Manifest) -> str:
    return str((pod["metadata"].get("labels") or {}).get(TEMPLATE_HASH_LABEL, ""))


def _seconds(timestamp: str) -> float:
    return datetime.datetime.fromisoformat(timestamp).timestamp() if timestamp else 0.0
