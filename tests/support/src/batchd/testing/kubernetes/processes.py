"""How the test cluster runs programs: the long-lived components (etcd, the API server, containerd,
the kubelet, ...) as `Process`es with a log each, and short commands (kubectl, helm, ip, ctr) that
fail loudly with their own message."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Self


class CommandFailed(subprocess.CalledProcessError):
    """A command that failed, shown with its own message."""

    def __str__(self) -> str:
        shown = [str(part) for part in self.cmd if not str(part).startswith("--kubeconfig=")]
        return f"{' '.join(shown)} exited {self.returncode}:\n{self.stderr}"


def run(
    command: Sequence[str],
    *,
    check: bool = True,
    input: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float | None = 120.0,
) -> subprocess.CompletedProcess[str]:
    """Run `command` to its end; with `check`, a failure raises `CommandFailed`."""
    result = subprocess.run(
        list(command), capture_output=True, text=True, input=input, env=env, timeout=timeout_s, check=False
    )
    if check and result.returncode != 0:
        raise CommandFailed(result.returncode, result.args, result.stdout, result.stderr)
    return result


@dataclass
class Process:
    """One component's process and the log it writes."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    _log_file: IO[bytes] = field(repr=False)

    @classmethod
    def start(cls, name: str, command: Sequence[str], log: Path, *, cwd: Path | None = None) -> Process:
        log_file = log.open("ab")
        popen = subprocess.Popen(
            list(command), stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd
        )
        return cls(name, popen, log, log_file)

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._log_file.close()


class Started:
    """A part of the cluster used as a context manager: started on entry (stopped again if the start
    fails half way), stopped on exit."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
