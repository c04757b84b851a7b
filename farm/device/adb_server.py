"""An adb server the farm owns: the adb binary from the adbutils wheel, on the farm's own port and HOME.

It never touches the user's default server on 5037 nor ~/.android. ``listen_all`` serves the network
(``adb -a``): with phones on several hosts, each host runs one such server and the farm talks to all.
The port is always given: a farm home's own (``farm.config.home_adb_port``: homes on one host never
share a server by accident) or one a config names (a shared server).

    server = AdbServer(port=home_adb_port(home), home=home / "adb-home" / str(port))
    server.start()                     # reuses a server already answering on that port
    server.connect("127.0.0.1:23456"); server.wait_for_state("127.0.0.1:23456", "device", 30)
    server.client().device("127.0.0.1:23456").shell("getprop ro.soc.model")
    server.stop()
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import adbutils
from adbutils import AdbConnection
from adbutils.errors import AdbConnectionError

from farm import procs
from farm.config import farm_home
from farm.errors import AdbError, AdbServerDown

log = logging.getLogger(__name__)


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


def server_unreachable(cause: BaseException) -> bool:
    """Whether an error from a request to an adb server (a host service, or opening a device
    transport) means the server itself cannot be reached: nothing accepts on its port, or it refused,
    reset or closed the connection before answering. Not for errors inside an open device stream,
    where a reset is the device's (ask the server, see DeviceTransport._lost)."""
    if isinstance(cause, AdbConnectionError):  # adbutils: "connect to adb server failed: ..."
        return True
    if isinstance(cause, adbutils.AdbTimeout):
        return "connect to adb server" in str(cause)  # a connect timeout, not a slow answer
    if isinstance(cause, (ConnectionError, EOFError)):  # refused, reset, aborted, broken pipe
        return True
    if isinstance(cause, adbutils.AdbError):
        # The server closed the connection without an answer (adbutils reads an empty status).
        text = str(cause)
        return text == "connection closed" or text.startswith("Unknown data: b''")
    return False


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
    port: int
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
            return self.client(socket_timeout=timeout).server_version() > 0
        except (adbutils.AdbError, OSError, ValueError):
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

    def argv(self) -> list[str]:
        """The server's command line (under the owner watchdog when ``exit_with_pid`` is set)."""
        argv = [adb_binary(), *(["-a"] if self.listen_all else []), "-P", str(self.port),
                "server", "nodaemon"]
        return argv if self.exit_with_pid is None else procs.tied_argv(self.exit_with_pid, argv)

    def owned(self) -> procs.Owned:
        """Ownership of a pid: our adb server on this port, or the watchdog around one; a reused pid
        (or the user's own adb server) is left alone."""
        return procs.cmdline_has([adb_binary()], ["-P", str(self.port), "server", "nodaemon"])

    # --- start / stop ------------------------------------------------------------------------
    def ensure_running(self, timeout: float = 20.0) -> bool:
        """Start the server unless it answers; True if (re)started here. A server that cannot be
        started is ``AdbServerDown`` naming it (with its log tail)."""
        try:
            return self.start(timeout=timeout)
        except AdbServerDown:
            raise
        except AdbError as e:
            raise AdbServerDown(f"{self} is down and could not be restarted: {e}",
                                server=f"{self.host}:{self.port}") from None

    def start(self, timeout: float = 20.0) -> bool:
        """Start the server unless one already answers on the port. Returns True if started here."""
        if self.is_running():
            return False
        self.home.mkdir(parents=True, exist_ok=True)
        self._kill_stale()
        if self._port_taken():
            raise AdbError(f"{self}: port {self.port} is in use by something that is not an adb "
                           f"server; name another [[adb_servers]] port in the config (a farm "
                           f"home's own port: delete its adb-port file for a new one)")
        argv = self.argv()
        env = self.env() if self.exit_with_pid is None else procs.farm_env(self.env())
        try:
            self._proc = procs.spawn(argv, log_path=self.home / LOG_FILE, env=env, cwd=self.home)
        except OSError as e:
            raise AdbError(f"{self}: cannot run {argv[0]}: {e}") from None
        procs.write_pid_file(self.home / PID_FILE, self._proc.pid)
        if procs.wait_until(lambda: self.is_running(timeout=1.0) or self._proc.poll() is not None,
                            timeout) and self._proc.poll() is None:
            self.started_here = True
            return True
        code = self._proc.poll()
        procs.stop_child(self._proc)
        self._proc = None
        (self.home / PID_FILE).unlink(missing_ok=True)
        why = f"exited with {code}" if code is not None else f"not answering after {timeout:.0f}s"
        raise AdbError(f"{self}: failed to start ({why}); log: {self.home / LOG_FILE}: "
                       f"{procs.log_tail(self.home / LOG_FILE)}")

    def stop(self, timeout: float = 10.0) -> None:
        """``kill-server``, then make sure the process is gone (also a stale one we started)."""
        try:
            self.client(socket_timeout=2.0).server_kill()
        except (adbutils.AdbError, OSError) as e:
            log.warning("%s: kill-server failed (%s); ending its process instead", self, e)
        pid = self._pid()
        if pid is not None and not procs.wait_gone(pid, self.owned(), timeout, self._proc):
            procs.terminate(pid, self.owned(), proc=self._proc)
        if self._proc is not None:
            procs.stop_child(self._proc)  # reaps it; a no-op when it exited
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
            self.client(socket_timeout=5.0).disconnect(addr, raise_error=True)
        except (adbutils.AdbError, OSError) as e:
            if "no such device" not in str(e):
                log.warning("%s: disconnect %s failed: %s", self, addr, e)

    def devices(self) -> dict[str, str]:
        """serial -> state (device, offline, unauthorized, ...) as the server lists them."""
        try:
            return {info.serial: info.state for info in self.client(socket_timeout=10).list()}
        except (adbutils.AdbError, OSError, EOFError) as e:
            if server_unreachable(e):
                raise AdbServerDown(f"{self} unreachable: cannot list devices: {e}",
                                    server=f"{self.host}:{self.port}") from None
            raise AdbError(f"{self}: cannot list devices: {e}") from None

    def wait_for_state(self, serial: str, state: str = "device", timeout: float = 30.0) -> None:
        seen: dict[str, str | None] = {}

        def reached() -> bool:
            seen["now"] = self.devices().get(serial)
            return seen["now"] == state

        if not procs.wait_until(reached, timeout, interval=0.1):
            raise AdbError(f"{self}: device {serial} is {seen['now'] or 'absent'}, not {state}, "
                           f"after {timeout:.0f}s", serial=serial)

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
        return procs.read_pid_file(self.home / PID_FILE)

    def _kill_stale(self) -> None:
        """A server we started earlier that no longer answers (hung, or half dead): end it."""
        procs.terminate(self._pid(), self.owned(), proc=self._proc)
        self._proc = None
        (self.home / PID_FILE).unlink(missing_ok=True)
