"""A real Kubernetes node on this machine: containerd (with runc and the CNI plugins from Debian),
the kubelet and kube-proxy, all in the node's own network namespace (`network`).

Nothing about the node is emulated: the kubelet runs pods as containers from the images built
from our Dockerfile, probes them, sends SIGTERM with the grace period; kube-proxy writes the
Services' iptables rules in the node's namespace. GPUs are the one thing this machine lacks: a node
can advertise `nvidia.com/gpu` as an extended resource, so GPU pods are scheduled as on a GPU node.

containerd's root is the node's copy of the machine's one image store (`image_store`): every image
is there when the node starts, and nothing is imported per node. Its state, sockets and the
kubelet's files are the session's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import tomli_w
import yaml

from batchd.testing.kubernetes.controlplane import ControlPlane, certificate_user, kubeconfig
from batchd.testing.kubernetes.image_store import ctr, node_copy
from batchd.testing.kubernetes.network import NodeAddresses, make_node_network, remove_node_network
from batchd.testing.kubernetes.processes import Process, Started, run

CNI_PLUGINS = Path("/usr/lib/cni")
CGROUPS = Path("/sys/fs/cgroup")
PAUSE_IMAGE = "localhost/batchd-pause:3.10"
START_TIMEOUT_S = 120.0
# What containerd (1.6, Debian's) logs once its CRI service serves.
CRI_SERVING = "Start streaming server"


class Node(Started):
    """One node of `cluster`, started in `directory`."""

    def __init__(self, cluster: ControlPlane, addresses: NodeAddresses, directory: Path) -> None:
        self.cluster = cluster
        self.addresses = addresses
        self.name = addresses.name
        self.directory = directory
        self.processes: dict[str, Process] = {}
        self._stack = contextlib.ExitStack()
        self.containerd_root = Path()  # copied from the image store when it starts
        self.socket = directory / "containerd.sock"

    # --- configuration -------------------------------------------------------------------------

    def _containerd_config(self) -> Path:
        cri = {
            "sandbox_image": PAUSE_IMAGE,
            # This VM withholds CAP_SYS_RESOURCE: runc may not raise a container's oom_score_adj.
            "restrict_oom_score_adj": True,
            "stream_server_address": "127.0.0.1",
            "cni": {"bin_dir": str(CNI_PLUGINS), "conf_dir": str(self.directory / "cni")},
            "containerd": {
                "snapshotter": "overlayfs",
                "default_runtime_name": "runc",
                "runtimes": {"runc": {"runtime_type": "io.containerd.runc.v2"}},
            },
        }
        config = {
            "version": 2,
            "root": str(self.containerd_root),
            "state": str(self.directory / "containerd-state"),
            "grpc": {"address": str(self.socket)},
            "ttrpc": {"address": f"{self.socket}.ttrpc"},
            "plugins": {"io.containerd.grpc.v1.cri": cri},
        }
        path = self.directory / "containerd.toml"
        path.write_text(tomli_w.dumps(config))
        return path

    def _cni_config(self) -> None:
        subnet = self.addresses.pod_subnet
        gateway = str(subnet.network_address + 1)
        conflist = {
            "cniVersion": "1.0.0",
            "name": "batchd",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": True,
                    "hairpinMode": True,  # a pod reaches itself through its own Service
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": str(subnet), "gateway": gateway}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.directory / "cni-ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }
        (self.directory / "cni").mkdir(exist_ok=True)
        (self.directory / "cni" / "10-batchd.conflist").write_text(json.dumps(conflist))

    def _kubelet_config(self) -> Path:
        ca = self.cluster.ca
        serving = ca.issue(
            f"{self.name}-kubelet", self.name, hosts=(self.addresses.ip,), server=True, client=False
        )
        resolv = self.directory / "resolv.conf"
        resolv.write_text("")  # pods resolve through the cluster DNS only
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.addresses.ip,
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "authentication": {
                "x509": {"clientCAFile": str(ca.cert)},
                "webhook": {"enabled": True},
                "anonymous": {"enabled": False},
            },
            "authorization": {"mode": "Webhook"},
            "tlsCertFile": str(serving.cert),
            "tlsPrivateKeyFile": str(serving.key),
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "cgroupDriver": "cgroupfs",
            # Several kubelets share this machine's cgroups: each keeps its pods under its own root.
            "cgroupRoot": f"/{self.name}",
            # This VM mounts cgroup v1, which kubelet 1.35 refuses unless told.
            "failCgroupV1": False,
            "failSwapOn": False,
            "clusterDNS": [self.cluster.addresses.api],
            "clusterDomain": "cluster.local",
            "resolvConf": str(resolv),
            # The disk reports far more size than is free to us: thresholds in bytes, never in
            # percent, and no image garbage collection by percentage.
            "evictionHard": {
                "memory.available": "200Mi",
                "nodefs.available": "2Gi",
                "imagefs.available": "2Gi",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "syncFrequency": "5s",
            "fileCheckFrequency": "5s",
            "nodeStatusUpdateFrequency": "5s",
            "shutdownGracePeriod": "0s",
        }
        path = self.directory / "kubelet.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def _kube_proxy_config(self) -> Path:
        identity = self.cluster.ca.issue(f"{self.name}-proxy", "system:kube-proxy")
        kubeconfig_path = self.directory / "kube-proxy.kubeconfig"
        kubeconfig_path.write_text(
            yaml.safe_dump(
                kubeconfig(self.cluster.server, self.cluster.ca.cert, user=certificate_user(identity))
            )
        )
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig_path)},
            "mode": "iptables",
            "clusterCIDR": self.cluster.addresses.pod_cidr,
            "bindAddress": self.addresses.ip,
            "healthzBindAddress": "127.0.0.1:10256",
            "metricsBindAddress": "127.0.0.1:10249",
            "nodePortAddresses": [f"{self.addresses.ip}/32"],
            "hostnameOverride": self.name,
            # The node shares the kernel's conntrack table: leave its size as it is.
            "conntrack": {"maxPerCore": 0, "min": 0},
        }
        path = self.directory / "kube-proxy.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    # --- processes -----------------------------------------------------------------------------

    def in_node(self, command: list[str]) -> list[str]:
        """`command` as run in the node's network namespace."""
        # nsenter joins only the network namespace: `ip netns exec` would also remount /sys and
        # hide the cgroup mounts the kubelet and runc need.
        return ["nsenter", f"--net=/run/netns/{self.addresses.netns}", *command]

    def start_process(self, name: str, command: list[str]) -> Process:
        """`command` started in the node's network namespace, logged beside the node's own; the
        caller stops it (a process of the node's own is stopped with the node)."""
        return Process.start(name, self.in_node(command), self.directory / f"{name}.log")

    def _start(self, name: str, command: list[str]) -> Process:
        process = self.start_process(name, command)
        self.processes[name] = process
        return process

    def start(self) -> Node:
        started = time.monotonic()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.containerd_root = self._stack.enter_context(node_copy(self.name))
        make_node_network(self.addresses)
        make_cgroup_root(self.name)
        self._cni_config()
        self._start("containerd", ["containerd", "--config", str(self._containerd_config())])
        # Its socket answers before its CRI service has initialised, and a kubelet that asks then
        # exits ("server is not initialized yet"); the CRI service says so once it serves.
        self._wait(
            lambda: (
                self.socket.exists()
                and CRI_SERVING in self.processes["containerd"].log.read_text(errors="replace")
            ),
            "containerd's CRI service",
        )
        identity = self.cluster.ca.issue(
            self.name, f"system:node:{self.name}", organizations=("system:nodes",)
        )
        node_kubeconfig = self.directory / "kubelet.kubeconfig"
        node_kubeconfig.write_text(
            yaml.safe_dump(
                kubeconfig(self.cluster.server, self.cluster.ca.cert, user=certificate_user(identity))
            )
        )
        self._start(
            "kubelet",
            [
                self.cluster.tools["kubelet"],
                f"--config={self._kubelet_config()}",
                f"--kubeconfig={node_kubeconfig}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.addresses.ip}",
                f"--root-dir={self.directory / 'kubelet'}",
                f"--cert-dir={self.directory / 'kubelet-certs'}",
                "--v=1",
            ],
        )
        self._start(
            "kube-proxy", [self.cluster.tools["kube-proxy"], f"--config={self._kube_proxy_config()}", "--v=1"]
        )
        self._wait(self.ready, "the node to be Ready")
        self.start_seconds = time.monotonic() - started
        return self

    def ready(self) -> bool:
        result = self.cluster.kubectl("get", "node", self.name, "-o", "json", check=False)
        if result.returncode != 0:
            return False
        conditions = json.loads(result.stdout)["status"].get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def _wait(self, condition: Any, what: str, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for process in self.processes.values():
                if process.popen.poll() is not None:
                    raise RuntimeError(
                        f"{process.name} exited ({process.popen.returncode}):\n{process.tail()}"
                    )
            if condition():
                return
            time.sleep(0.2)
        logs = "\n".join(f"--- {p.name}\n{p.tail(20)}" for p in self.processes.values())
        raise TimeoutError(f"timed out after {timeout_s}s waiting for {what} on {self.name}\n{logs}")

    def advertise_gpus(self, count: int) -> None:
        """`nvidia.com/gpu: count` in the node's capacity, as NVIDIA's device plugin would report it."""
        patch = [{"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": str(count)}]
        self.cluster.kubectl(
            "patch", "node", self.name, "--subresource=status", "--type=json", "-p", json.dumps(patch)
        )

    def ctr(
        self, *args: str, check: bool = True, timeout_s: float | None = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """containerd's own client, on the namespace the kubelet's containers and images live in."""
        return ctr(self.socket, *args, check=check, timeout_s=timeout_s)

    def stop(self) -> None:
        # The kubelet first, so it starts nothing more; then every container of this session.
        for name in ("kube-proxy", "kubelet"):
            if name in self.processes:
                self.processes[name].stop()
        # A node that is gone leaves the cluster: its pods are collected, and nothing is scheduled
        # on it while the control plane lives on.
        self.cluster.kubectl("delete", "node", self.name, "--ignore-not-found", "--wait=false", check=False)
        if "containerd" in self.processes:
            self._remove_containers()
            self.processes["containerd"].stop()
        remove_node_network(self.addresses)
        remove_cgroup_root(self.name)
        unmount_below(self.directory)
        self._stack.close()  # its copy of the store, once containerd has let it go

    def _remove_containers(self) -> None:
        for task in self.ctr("tasks", "list", "-q").stdout.split():
            self.ctr("tasks", "kill", "-s", "KILL", task, check=False)
        deadline = time.monotonic() + 15
        while self.ctr("tasks", "list", "-q").stdout.split() and time.monotonic() < deadline:
            time.sleep(0.1)
        for container in self.ctr("containers", "list", "-q").stdout.split():
            info = self.ctr("containers", "info", container, check=False).stdout
            self.ctr("tasks", "delete", "-f", container, check=False)
            self.ctr("containers", "delete", container, check=False)
            # A sandbox's network namespace is the CNI's to remove, which nobody asks it now.
            for netns in pod_network_namespaces(info):
                run(["ip", "netns", "del", netns], check=False)


def _hierarchies() -> list[Path]:
    """The mounted cgroup v1 hierarchies (cpu, memory, ..., and systemd's named one)."""
    return [path for path in CGROUPS.iterdir() if path.is_dir() and path.name != "unified"]


def make_cgroup_root(name: str) -> None:
    """The kubelet's `cgroupRoot` in every hierarchy: it refuses to start without it."""
    remove_cgroup_root(name)
    for hierarchy in _hierarchies():
        root = hierarchy / name
        root.mkdir(exist_ok=True)
        if hierarchy.name == "cpuset":  # a new cpuset has no CPUs or memory nodes until given some
            for knob in ("cpuset.cpus", "cpuset.mems"):
                (root / knob).write_text((hierarchy / knob).read_text())


def remove_cgroup_root(name: str, timeout_s: float = 15.0) -> None:
    """The kubelet's cgroups, deepest first (a cgroup goes only once its children are gone), and any
    process still in them (a container a killed session left)."""
    roots = [hierarchy / name for hierarchy in _hierarchies() if (hierarchy / name).is_dir()]
    cgroups = sorted(
        (path for root in roots for path in [root, *root.rglob("*")] if path.is_dir()),
        key=lambda path: len(path.parts),
        reverse=True,
    )
    for cgroup in cgroups:
        for pid in (cgroup / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    for cgroup in cgroups:
        while True:
            try:
                cgroup.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:  # busy until the killed processes have exited
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def pod_network_namespaces(container_info: str) -> list[str]:
    """The named network namespaces (/var/run/netns/NAME) a container's spec joins."""
    if not container_info:
        return []
    namespaces = json.loads(container_info).get("Spec", {}).get("linux", {}).get("namespaces", [])
    return [
        Path(ns["path"]).name
        for ns in namespaces
        if ns.get("type") == "network" and "/netns/" in ns.get("path", "")
    ]


def unmount_below(directory: Path) -> None:
    """Everything the kubelet and containerd mounted under `directory` (the kubelet's own root, the
    pods' volumes, the sandboxes' /dev/shm), deepest first, so the folder can be removed."""
    prefix = str(directory.resolve()) + "/"
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for mount_point in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
        run(["umount", "-l", mount_point], check=False)
