"""An OpenSSH server of the test's own on 127.0.0.1 (Debian's openssh-server; ci/test.sh installs it):
host and client keys, authorized_keys and known_hosts in the test's temporary directory, key login
only, local forwarding allowed. It stands for a phones' host whose adb server listens on its loopback."""

from __future__ import annotations

import getpass
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

SSHD = "/usr/sbin/sshd"


@dataclass
class Sshd:
    port: int
    user: str
    identity: Path
    known_hosts: Path
    proc: subprocess.Popen
    log: Path

    @property
    def target(self) -> str:
        return f"{self.user}@127.0.0.1"

    def adb_entry(self, remote_port: int, *, known_hosts: Path | None = None, local_port: int | None = None) -> str:
        """The ``[[adb_servers]]`` table of the farm config that reaches ``remote_port`` through it."""
        lines = ["[[adb_servers]]", f'ssh = "{self.target}"', f"ssh_port = {self.port}",
                 f'identity = "{self.identity}"', f'known_hosts = "{known_hosts or self.known_hosts}"',
                 f"remote_port = {remote_port}"]
        if local_port is not None:
            lines.append(f"local_port = {local_port}")
        return "\n".join(lines) + "\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_sshd(root: Path) -> Sshd:
    if not Path(SSHD).is_file() or shutil.which("ssh-keygen") is None or shutil.which("ssh") is None:
        pytest.skip("OpenSSH (openssh-server, openssh-client) is not installed; ci/test.sh installs it")
    if not Path("/run/sshd").is_dir():
        pytest.skip("sshd's privilege separation directory /run/sshd is missing; ci/test.sh makes it")
    root.mkdir(parents=True, exist_ok=True)
    for name in ("host_key", "id_ed25519"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / name)], check=True)
    (root / "authorized_keys").write_text((root / "id_ed25519.pub").read_text())
    (root / "authorized_keys").chmod(0o600)
    port = _free_port()
    host_pub = (root / "host_key.pub").read_text().split()
    (root / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    config = root / "sshd_config"
    config.write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {root / 'host_key'}",
        f"AuthorizedKeysFile {root / 'authorized_keys'}", f"PidFile {root / 'sshd.pid'}",
        "StrictModes no", "UsePAM no", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password", "AllowTcpForwarding local", "PermitTTY no", "X11Forwarding no",
        "PermitUserEnvironment no", "LogLevel VERBOSE", "",
    ]))
    log = root / "sshd.log"
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {log.read_text()[-2000:]}")
            time.sleep(0.05)
    else:
        proc.kill()
        raise RuntimeError(f"sshd did not listen on {port}: {log.read_text()[-2000:]}")
    return Sshd(port, getpass.getuser(), root / "id_ed25519", root / "known_hosts", proc, log)


def stop_sshd(sshd: Sshd) -> None:
    sshd.proc.terminate()
    try:
        sshd.proc.wait(5)
    except subprocess.TimeoutExpired:
        sshd.proc.kill()
        sshd.proc.wait()
