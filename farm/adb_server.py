"""An adb server the farm owns: the adb binary from the adbutils wheel, on the farm's own port and HOME.

It never touches the user's default server on 5037 nor ~/.android. ``listen_all`` serves the network
(``adb -a``): with phones on several hosts, each host runs one such server and the farm talks to all.

    server = AdbServer(port=15037, home=farm_home() / "adb-home" / "15037")
    server.start()                     # reuses a server already answering on that port
    server.connect("127.0.0.1:23456"); server.wait_for_state("127.0.0.1:23456", "device", 30)
    server.client().device("127.0.0.1:23456").shell("getprop ro.soc.model")
    server.stop()
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import adbutils
from adbutils import AdbConnection

from farm.config import DEFAULT_ADB_PORT, farm_home
from farm.errors import AdbError


class _NoSpawnConnection(AdbConnection):
    """An adb server connection that fails instead of running ``adb start-server``.

    adbutils starts a server on the *default* port when it cannot connect; for a farm that addresses
    its own servers (possibly on other hosts) that would leak a stray server and hide the real error.
    """

    def _safe_connect(self):
        return self._create_socket()


class FarmAdbClient(adbutils.AdbClient):
    """adbutils' client for one adb server, without the implicit server start."""

    def __init__(self, host: str, port: int, socket_timeout: float | None = None):
        super().__init__(host=host, port=port, socket_timeout=socket_timeout)
        self._socket_timeout = socket_timeout

    def make_connection(self, timeout: float | None = None) -> AdbConnection:
        conn = _NoSpawnConnection(self.host, self.port)
        timeout = timeout or self._socket_timeout
        if timeout:
            conn.conn.settimeout(timeout)
        return conn


PID_FILE = "server.pid"
LOG_FILE = "server.log"
# Variables that would point the server at the user's keys, devices or default server.
_SCRUBBED_ENV = ("ANDROID_SERIAL", "ANDROID_ADB_SERVER_ADDRESS", "ANDROID_ADB_SERVER_PORT",
                 "ANDROID_USER_HOME", "ANDROID_SDK_HOME", "ADB_VENDOR_KEYS", "ANDROID_VENDOR_KEYS")


def default_home(port: int) -> Path:
    return farm_home() / "adb-home" / str(port)


def adb_binary() -> str:
    return adbutils.adb_path()


@dataclass
class AdbServer:
    port: int = DEFAULT_ADB_PORT
    home: Path | None = None
    listen_all: bool = False
    host: str = "127.0.0.1"  # where clients reach it; a listen_all server on another host too
    exit_with_pid: int | None = None  # the server exits when this process is gone (test sessions)
    started_here: bool = field(default=False, init=False)
    _proc: subprocess.Popen | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise AdbError(f"adb server port {self.port} out of range")
        self.home = Path(self.home) if self.home is not None else default_home(self.port)

    def __str__(self) -> str:
        return f"adb server {self.host}:{self.port}"

    # --- state -------------------------------------------------------------------------------
    def is_running(self, timeout: float = 2.0) -> bool:
        """True when an adb server answers ``host:version`` on the port."""
        try:
            with socket.create_connection((self.host, self.port), timeout=timeout) as s:
                s.settimeout(timeout)
                request = b"host:version"
                s.sendall(b"%04x%s" % (len(request), request))
                return s.recv(4) == b"OKAY"
        except OSError:
            return False

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
        env["HOME"] = str(self.home)           # its own ~/.android/adbkey
        env["TMPDIR"] = str(self.home)         # its own adb.<uid>.log
        env["ADB_MDNS"] = "0"                  # no discovery of devices on the network
        # The native Linux USB backend still sees phones; where libusb cannot initialise (containers)
        # the libusb one makes every start wait 3 s for a device scan that never completes.
        env.setdefault("ADB_LIBUSB", "0")
        return env

    # --- start / stop ------------------------------------------------------------------------
    def start(self, timeout: float = 20.0) -> bool:
        """Start the server unless one already answers on the port. Returns True if started here."""
        if self.is_running():
            return False
        self.home.mkdir(parents=True, exist_ok=True)
        self._kill_stale()
        if self._port_taken():
            raise AdbError(f"{self}: port {self.port} is in use by something that is not an adb "
                           f"server; pick another adb_servers port")
        argv = [adb_binary(), *(["-a"] if self.listen_all else []), "-P", str(self.port),
                "server", "nodaemon"]
        if self.exit_with_pid is not None:
            argv = [sys.executable, "-m", "farm.adb_server", "--exit-with-pid",
                    str(self.exit_with_pid), "--", *argv]
        env = self.env()
        if self.exit_with_pid is not None:
            repo_root = str(Path(__file__).resolve().parents[1])
            env["PYTHONPATH"] = os.pathsep.join(p for p in (repo_root, env.get("PYTHONPATH")) if p)
        with open(self.home / LOG_FILE, "ab") as log:
            try:
                self._proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                              stdout=log, stderr=subprocess.STDOUT,
                                              start_new_session=True, cwd=self.home)
            except OSError as e:
                raise AdbError(f"{self}: cannot run {argv[0]}: {e}") from None
        (self.home / PID_FILE).write_text(str(self._proc.pid))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.is_running(timeout=1.0):
                self.started_here = True
                return True
            if self._proc.poll() is not None:
                break
            time.sleep(0.05)
        code = self._proc.poll()
        self._terminate(self._proc.pid)
        self._proc = None
        (self.home / PID_FILE).unlink(missing_ok=True)
        why = f"exited with {code}" if code is not None else f"not answering after {timeout:.0f}s"
        raise AdbError(f"{self}: failed to start ({why}); log: {self.home / LOG_FILE}: "
                       f"{self._log_tail()}")

    def stop(self, timeout: float = 10.0) -> None:
        """``kill-server``, then make sure the process is gone (also a stale one we started)."""
        if self.is_running():
            try:
                with socket.create_connection((self.host, self.port), timeout=2.0) as s:
                    s.settimeout(2.0)
                    s.sendall(b"0009host:kill")
                    s.recv(4)
            except OSError:
                pass
        pid = self._pid()
        if pid is not None:
            self._wait_gone(pid, timeout)
            if self._is_ours(pid):
                self._terminate(pid)
        if self._proc is not None:
            try:
                self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=5)
            self._proc = None
        (self.home / PID_FILE).unlink(missing_ok=True)
        self.started_here = False

    # --- clients -----------------------------------------------------------------------------
    def client(self, socket_timeout: float | None = None) -> FarmAdbClient:
        return FarmAdbClient(host=self.host, port=self.port, socket_timeout=socket_timeout)

    def connect(self, addr: str, timeout: float = 10.0) -> str:
        """``adb connect addr``; raises AdbError unless the server reports it connected."""
        try:
            answer = self.client().connect(addr, timeout=timeout)
        except (adbutils.AdbError, OSError) as e:
            raise AdbError(f"{self}: connect {addr}: {e}", serial=addr) from None
        if "connected to" not in answer:
            raise AdbError(f"{self}: connect {addr}: {answer}", serial=addr)
        return answer

    def disconnect(self, addr: str) -> None:
        """``adb disconnect addr``; a device the server does not know is not an error."""
        try:
            with self.client().make_connection(timeout=5.0) as c:
                c.send_command("host:disconnect:" + addr)
                c.check_okay()
                c.read_string_block()
        except (adbutils.AdbError, OSError):
            pass

    def devices(self) -> dict[str, str]:
        """serial -> state (device, offline, unauthorized, ...) as the server lists them."""
        try:
            return {info.serial: info.state for info in self.client(socket_timeout=10).list()}
        except (adbutils.AdbError, OSError) as e:
            raise AdbError(f"{self}: cannot list devices: {e}") from None

    def wait_for_state(self, serial: str, state: str = "device", timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        current = None
        while True:
            current = self.devices().get(serial)
            if current == state:
                return
            if time.monotonic() >= deadline:
                raise AdbError(f"{self}: device {serial} is {current or 'absent'}, not {state}, "
                               f"after {timeout:.0f}s", serial=serial)
            time.sleep(0.1)

    # --- helpers -----------------------------------------------------------------------------
    def _port_taken(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=1.0):
                return True
        except OSError:
            return False

    def _pid(self) -> int | None:
        if self._proc is not None:
            return self._proc.pid
        try:
            return int((self.home / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            return None

    def _kill_stale(self) -> None:
        """A server we started earlier that no longer answers (hung, or half dead): end it."""
        pid = self._pid()
        if pid is not None and self._is_ours(pid):
            self._terminate(pid)
        (self.home / PID_FILE).unlink(missing_ok=True)

    @staticmethod
    def _is_ours(pid: int) -> bool:
        """An adb server process, or our watchdog around one (a reused pid is left alone)."""
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        return os.path.basename(cmdline[0]) == b"adb" or b"farm.adb_server" in cmdline

    @staticmethod
    def _wait_gone(pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not AdbServer._is_ours(pid):
                return True
            time.sleep(0.05)
        return False

    def _terminate(self, pid: int) -> None:
        for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0)):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return
            if self._proc is not None and self._proc.pid == pid:
                try:
                    self._proc.wait(timeout=wait)
                    return
                except subprocess.TimeoutExpired:
                    continue
            if self._wait_gone(pid, wait):
                return

    def _log_tail(self, lines: int = 5) -> str:
        try:
            text = (self.home / LOG_FILE).read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(text[-lines:]) or "(empty log)"


def _watchdog(argv: list[str] | None = None) -> int:
    """``python -m farm.adb_server --exit-with-pid PID -- adb ... server nodaemon``: run the server
    and end it when PID is gone, so a test session killed -9 leaves no adb server behind."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m farm.adb_server")
    parser.add_argument("--exit-with-pid", type=int, required=True)
    parser.add_argument("command", nargs="+")
    args = parser.parse_args(argv)
    child = subprocess.Popen(args.command)
    signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    while True:
        try:
            return child.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.kill(args.exit_with_pid, 0)
        except ProcessLookupError:
            child.terminate()
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                child.kill()
            return 0
        except PermissionError:
            pass


if __name__ == "__main__":
    sys.exit(_watchdog())
