"""The Kubernetes Pod Security Standards' "restricted" profile, as checks on a pod spec.

Each rule of https://kubernetes.io/docs/concepts/security/pod-security-standards/ (the baseline
rules, which restricted includes, and the restricted ones), checked the way the PodSecurity
admission controller reads them: a container may inherit a setting from the pod's
securityContext, and a field left out is checked against its default. Returns one message per
violation, naming the field, so a test can show exactly what a namespace labelled
`pod-security.kubernetes.io/enforce: restricted` would refuse.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

# Volume types the restricted profile allows.
ALLOWED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
# Sysctls the baseline profile allows.
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def _containers(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for index, container in enumerate(spec.get(kind) or []):
            yield f"spec.{kind}[{index}]", container


def restricted_violations(pod_spec: dict[str, Any], pod_metadata: dict[str, Any] | None = None) -> list[str]:
    """Every way `pod_spec` (a pod's, or a template's `spec`) breaks the restricted profile."""
    problems: list[str] = []
    pod_context = pod_spec.get("securityContext") or {}
    annotations = (pod_metadata or {}).get("annotations") or {}

    # Baseline: host namespaces, host paths and ports, privileges, capabilities, sysctls, /proc.
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(field):
            problems.append(f"spec.{field}: must be unset or false")
    for index, volume in enumerate(pod_spec.get("volumes") or []):
        kinds = set(volume) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            problems.append(f"spec.volumes[{index}]: type {sorted(kinds - ALLOWED_VOLUMES)} is not allowed")
    for index, sysctl in enumerate(pod_context.get("sysctls") or []):
        if sysctl.get("name") not in SAFE_SYSCTLS:
            problems.append(
                f"spec.securityContext.sysctls[{index}]: {sysctl.get('name')!r} is not a safe sysctl"
            )
    for where, value in _seccomp_and_selinux(pod_context, "spec.securityContext"):
        problems.append(f"{where}: {value}")
    if pod_context.get("runAsUser") == 0:
        problems.append("spec.securityContext.runAsUser: must not be 0")
    for key, value in annotations.items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and not (
            value == "runtime/default" or value.startswith("localhost/")
        ):
            problems.append(f"metadata.annotations[{key}]: AppArmor profile {value!r} is not allowed")

    pod_non_root = pod_context.get("runAsNonRoot") is True
    pod_seccomp = (pod_context.get("seccompProfile") or {}).get("type") in ("RuntimeDefault", "Localhost")
    for where, container in _containers(pod_spec):
        context = container.get("securityContext") or {}
        if context.get("privileged"):
            problems.append(f"{where}.securityContext.privileged: must be unset or false")
        if context.get("procMount", "Default") != "Default":
            problems.append(f"{where}.securityContext.procMount: must be Default")
        for port_index, port in enumerate(container.get("ports") or []):
            if port.get("hostPort"):
                problems.append(f"{where}.ports[{port_index}].hostPort: must be unset or 0")
        for field, value in _seccomp_and_selinux(context, f"{where}.securityContext"):
            problems.append(f"{field}: {value}")
        if (context.get("windowsOptions") or {}).get("hostProcess"):
            problems.append(f"{where}.securityContext.windowsOptions.hostProcess: must be false")
        # Restricted: no escalation, non-root, seccomp, capabilities dropped to at most NET_BIND_SERVICE.
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}.securityContext.allowPrivilegeEscalation: must be false")
        if not (
            context.get("runAsNonRoot") is True or (pod_non_root and context.get("runAsNonRoot") is None)
        ):
            problems.append(f"{where}.securityContext.runAsNonRoot: must be true (here or for the pod)")
        if context.get("runAsUser") == 0:
            problems.append(f"{where}.securityContext.runAsUser: must not be 0")
        seccomp = (context.get("seccompProfile") or {}).get("type")
        if not (seccomp in ("RuntimeDefault", "Localhost") or (seccomp is None and pod_seccomp)):
            problems.append(
                f"{where}.securityContext.seccompProfile.type: must be RuntimeDefault or Localhost"
            )
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            problems.append(f"{where}.securityContext.capabilities.drop: must include ALL")
        added = set(capabilities.get("add") or [])
        if added - {"NET_BIND_SERVICE"}:
            problems.append(
                f"{where}.securityContext.capabilities.add: only NET_BIND_SERVICE, not {sorted(added)}"
            )
        if added - BASELINE_CAPABILITIES:
            problems.append(
                f"{where}.securityContext.capabilities.add: {sorted(added - BASELINE_CAPABILITIES)}"
            )
    return problems


def _seccomp_and_selinux(context: dict[str, Any], where: str) -> Iterator[tuple[str, str]]:
    seccomp = (context.get("seccompProfile") or {}).get("type")
    if seccomp == "Unconfined":
        yield f"{where}.seccompProfile.type", "must not be Unconfined"
    selinux = context.get("seLinuxOptions") or {}
    if selinux.get("type", "") not in SELINUX_TYPES:
        yield f"{where}.seLinuxOptions.type", f"{selinux.get('type')!r} is not allowed"
    if selinux.get("user") or selinux.get("role"):
        yield f"{where}.seLinuxOptions", "user and role must be unset"
