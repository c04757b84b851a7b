"""An adb server on another host, reached over SSH: an OpenSSH local forward from this host's loopback
to that host's adb server on its own loopback, supervised while the farm is open.

``adb -a`` (an adb server listening on the network) lets anyone who can reach the port push to and run
on the phones: adb has no authentication between client and server. Over SSH, the phones' host keeps
its adb server on 127.0.0.1, and only holders of an authorized key reach it, as labgrid's exporters are
reached. The forward listens on 127.0.0.1 only.

The local port is the adb server's address as the pool records it (``127.0.0.1:<local_port>``): the
same on every host and in every process that reaches that remote host (``farm.config`` derives it from
the SSH target unless it is given), so the pool's device rows agree. Processes of one host share one
forward: a port that already answers as an adb server is used as it is, and whoever finds it gone
starts one again. A forward that dies mid-run makes the commands in flight fail as the adb server's
(AdbServerDown: infrastructure, re-run), and the supervisor starts it again within a second.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from farm import procs
from farm.config import SshTunnelConfig
from farm.errors import AdbServerDown

log = logging.getLogger(__name__)

START_TIMEOUT_S = 20.0
CHECK_INTERVAL_S = 0.5


def ssh_argv(t: SshTunnelConfig) -> list[str]:
    """The ssh command of the forward: no shell, no terminal, no password prompt, the host key checked
    (against ``known_hosts`` when given), and an exit when the forward cannot be made or the link is
    dead (keep-alives), so the supervisor sees it."""
    argv = ["ssh", "-N", "-T", "-p", str(t.ssh_port),
            "-o", "BatchMode=yes", "-o", "ExitOnForwardFailure=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3", "-o", "ConnectTimeout=10",
            "-o", "ControlMaster=no", "-o", "ControlPath=none", "-o", "ClearAllForwardings=no",
            "-L", f"127.0.0.1:{t.local_port}:{t.remote_host}:{t.remote_port}"]
    if t.identity:
        argv += ["-i", t.identity, "-o", "IdentitiesOnly=yes"]
    if t.known_hosts:
        argv += ["-o", f"UserKnownHostsFile={t.known_hosts}"]
    return [*argv, "--", t.target]  # "--": the target is never read as an option


def adb_answers(port: int, timeout: float = 2.0) -> bool:
    """Whether an adb server answers on 127.0.0.1:``port`` (``host:version``)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(b"000chost:version")
            return s.recv(4) == b"OKAY"
    except OSError:
        return False


@dataclass
class TunnelState:
    starts: int = 0
    restarts: int = 0
    shared: bool = False  # the forward of another process of this host was found and used


class SshTunnel:
    """One supervised forward. ``start`` makes it (or finds another process's), ``ensure`` makes it
    again when it is gone, ``stop`` ends ours."""

    def __init__(self, config: SshTunnelConfig, *, log_dir: Path):
        self.config = config
        self.log_path = Path(log_dir) / f"ssh-{config.local_port}.log"
        self.proc: subprocess.Popen | None = None
        self.state = TunnelState()
        self._lock = threading.Lock()

    @property
    def where(self) -> str:
        t = self.config
        return f"adb server {t.remote_host}:{t.remote_port} on {t.target} over SSH (port {t.ssh_port})"

    def alive(self) -> bool:
        return adb_answers(self.config.local_port, timeout=1.0)

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        with self._lock:
            self._start(timeout)

    def _start(self, timeout: float) -> None:
        if self.alive():
            self.state.shared = self.proc is None or self.proc.poll() is not None
            return
        self._reap()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = procs.tied_argv(os.getpid(), ssh_argv(self.config))
        try:
            self.proc = procs.spawn(argv, log_path=self.log_path, env=procs.farm_env())
        except OSError as e:
            raise AdbServerDown(f"{self.where}: cannot start ssh: {e.strerror or e}",
                                server=f"127.0.0.1:{self.config.local_port}") from None
        self.state.starts += 1
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.alive():
                self.state.shared = False
                return
            if self.proc.poll() is not None:
                if self.alive():  # another process of this host won the port: use its forward
                    self.state.shared = True
                    return
                break
            time.sleep(0.1)
        tail = procs.log_tail(self.log_path)
        self._reap()
        raise AdbServerDown(f"{self.where}: the SSH forward to it did not come up within {timeout:g}s "
                            f"(ssh: {tail})", server=f"127.0.0.1:{self.config.local_port}")

    def ensure(self) -> bool:
        """Start the forward again if it is gone; True when it was."""
        with self._lock:
            if self.alive():
                return False
            log.warning("%s: the SSH forward on 127.0.0.1:%d is gone; starting it again", self.where,
                        self.config.local_port)
            self.state.restarts += 1
            self._start(START_TIMEOUT_S)
            return True

    def _reap(self) -> None:
        if self.proc is not None:
            procs.stop_child(self.proc, grace=1.0, timeout=2.0)
            self.proc = None

    def stop(self) -> None:
        with self._lock:
            self._reap()


# This process's forwards, by local port: opened once, supervised by one thread, ended at exit (and by
# their watchdog if this process is killed).
_OPEN: dict[int, SshTunnel] = {}
_REGISTRY_LOCK = threading.Lock()
_SUPERVISOR: threading.Thread | None = None


def ensure_tunnels(configs: Sequence[SshTunnelConfig], *, log_dir: Path) -> list[SshTunnel]:
    """Every configured forward up in this process (an AdbServerDown names the one that is not), and
    kept up while the process runs."""
    global _SUPERVISOR
    opened = []
    with _REGISTRY_LOCK:
        for config in configs:
            tunnel = _OPEN.get(config.local_port)
            if tunnel is None or tunnel.config != config:
                tunnel = SshTunnel(config, log_dir=log_dir)
                tunnel.start()
                _OPEN[config.local_port] = tunnel
            opened.append(tunnel)
        if _OPEN and (_SUPERVISOR is None or not _SUPERVISOR.is_alive()):
            _SUPERVISOR = threading.Thread(target=_supervise, name="ssh-tunnels", daemon=True)
            _SUPERVISOR.start()
            atexit.register(close_tunnels)
    return opened


def _supervise() -> None:
    while True:
        time.sleep(CHECK_INTERVAL_S)
        with _REGISTRY_LOCK:
            tunnels = list(_OPEN.values())
        if not tunnels:
            return
        for tunnel in tunnels:
            try:
                tunnel.ensure()
            except AdbServerDown as e:  # tried again on the next look
                log.warning("%s", e)


def close_tunnels() -> None:
    """End this process's forwards (another process of the host that used one starts its own)."""
    with _REGISTRY_LOCK:
        tunnels = list(_OPEN.values())
        _OPEN.clear()
    for tunnel in tunnels:
        tunnel.stop()
