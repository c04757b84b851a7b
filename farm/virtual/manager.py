"""Start, list and stop a farm of virtual devices behind the farm's own adb server.

State lives in ``<farm home>/virtual/state.json`` (written atomically after every change), so that
``down()`` from another process, or after a crash, still finds every process to end: stale pids,
missing processes and a leftover state file are all fine.

The adb server is the home's own (``farm.config.home_adb_port``) unless a port is given. Devices tied
to an owner process (a test session, a ``--virtual`` run) stay tied when another process changes
them (``farm virtual online`` from a shell): the owner is in the state file, and the owner's
``down()`` ends whatever the state file lists by then. A server that still serves devices that are
not this farm's (a shared, configured port) is left running by ``down()``.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import socket
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Self

import adbutils
import psutil

from farm import procs
from farm.config import DEFAULT_WORKSPACE, AdbServerAddress, home_adb_port
from farm.device.adb_server import AdbServer
from farm.errors import AdbError, AdbServerDown, InfraError, UsageError
from farm.fileio import write_atomic
from farm.virtual.confine import (
    MEDIA_REL,
    STORAGE_REL,
    ConfinementUnavailable,
    find_tools,
    probe,
    unconfined_requested,
)
from farm.virtual.device import EXIT_UNCONFINABLE, PGID_DIR, RUN_FILE, device_argv
from farm.runner.timing import Slowdown
from farm.virtual.faults import NO_FAULTS, Faults, write_faults
from farm.virtual.identity import (
    VirtualDeviceSpec,
    create_device_root,
    host_workspace,
    load_identity,
    make_identity,
)
from farm.virtual.phone import PhoneState, load_phone, save_phone
from farm.virtual.simphone import set_slowdowns
from farm.virtual.shell import kill_commands

STATE_FILE = "state.json"
EMULATOR_PORTS = range(5554, 5586)  # the adb server adopts anything listening there as an emulator
DEVICE_LOG = "device.log"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VirtualDeviceProcess:
    """A running virtual device: its process (pid), the loopback port it listens on and the root
    directory holding its state. What the device announces (props, SoC) is in that root
    (farm.virtual.identity); what discovery learns of it is a farm.devices.DeviceInfo."""

    serial: str   # as the adb server lists it: 127.0.0.1:PORT
    port: int
    pid: int
    root: Path
    soc: str
    serialno: str  # ro.serialno
    confined: bool = True  # False: degraded mode, its commands run on the host (ro.ptefarm.confined=0)

    @property
    def workspace(self) -> str:
        """The farm's workspace as the device names it (ro.ptefarm.workspace): an Android path, or a
        host path for an unconfined device."""
        return DEFAULT_WORKSPACE if self.confined else str(host_workspace(self.root))

    def host_path(self, device_path: str) -> Path:
        """Where a path of the device's storage (``/data/...``, ``/sdcard/...``) is on the host, for
        tests that check what a device did. ValueError for a path outside its storage."""
        if not self.confined:
            return Path(device_path)
        norm = posixpath.normpath(device_path)
        for prefix, rel in (("/data", STORAGE_REL), ("/sdcard", MEDIA_REL),
                            ("/storage/emulated/0", MEDIA_REL)):
            if norm == prefix or norm.startswith(prefix + "/"):
                return self.root / rel / norm[len(prefix):].lstrip("/")
        raise ValueError(f"{device_path}: not in the storage of virtual device {self.serial}")

    def to_json(self) -> dict:
        d = asdict(self)
        d["root"] = str(self.root)
        return d

    @classmethod
    def from_json(cls, d: dict) -> VirtualDeviceProcess:
        return cls(serial=d["serial"], port=int(d["port"]), pid=int(d["pid"]), root=Path(d["root"]),
                   soc=d["soc"], serialno=d.get("serialno", ""), confined=d.get("confined", True))


@dataclass(frozen=True)
class VirtualDeviceStatus:
    process: VirtualDeviceProcess
    alive: bool        # the device process runs
    adb_state: str     # as the farm's adb server lists it, or "absent"


def free_port() -> int:
    """A free TCP port on loopback, outside the emulator range the adb server probes."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in EMULATOR_PORTS:
            return port


class VirtualFarm:
    """Virtual devices + the adb server they are connected to. A context manager: exit = down()."""

    def __init__(self, home: Path | str, adb_port: int | None = None, *,
                 tie_to_owner: bool = True, owner_pid: int | None = None,
                 start_timeout: float = 30.0):
        self.home = Path(home).expanduser()
        self.dir = self.home / "virtual"
        self.state_path = self.dir / STATE_FILE
        self.tie_to_owner = tie_to_owner  # devices exit when this process dies (tests); not the CLI
        self.start_timeout = start_timeout
        self._procs: dict[int, subprocess.Popen] = {}
        self.left_running_for: list[str] = []  # after down(): others' devices on the server it left
        state = self._read_state()
        self.devices: list[VirtualDeviceProcess] = [
            VirtualDeviceProcess.from_json(d) for d in state.get("devices", [])]
        self.adb_started: bool = bool(state.get("adb_started", False))
        port = adb_port or state.get("adb_port") or home_adb_port(self.home)
        if state and adb_port and state.get("adb_port") != adb_port:
            raise UsageError(f"{self.state_path}: a virtual farm on adb port "
                             f"{state.get('adb_port')} is up; run 'farm virtual down' first")
        # Whose life the devices and the server share: the live owner the state names (a run whose
        # device a shell restarts), else ``owner_pid`` (a script that starts devices for its steps:
        # `farm virtual up --exit-with-pid`), else this process when tied (tests), else none (the
        # CLI's own).
        recorded = _live_owner(state.get("owner"))
        if owner_pid is not None and recorded is None:
            recorded = _owner_of(owner_pid)
            if recorded is None:
                raise UsageError(f"--exit-with-pid {owner_pid}: no such process")
        self.owner: dict | None = recorded or (_owner_of(os.getpid()) if tie_to_owner else None)
        self.server = AdbServer(port=port, home=self.home / "adb-home" / str(port),
                                exit_with_pid=self.owner["pid"] if self.owner else None)

    # --- public API --------------------------------------------------------------------------
    @property
    def adb_server(self) -> AdbServerAddress:
        return AdbServerAddress(self.server.host, self.server.port)

    def client(self) -> adbutils.AdbClient:
        return self.server.client()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self, specs: list[VirtualDeviceSpec]) -> list[VirtualDeviceProcess]:
        """Start one device per spec, connect each to the adb server, wait until each is 'device'."""
        for spec in specs:  # bad input is reported before anything starts
            spec.profile()
        check_confinement()  # and a host that cannot confine devices, before anything starts
        started_server = self.server.start(timeout=self.start_timeout)
        self.adb_started = self.adb_started or started_server
        self._save()
        started: list[VirtualDeviceProcess] = []
        try:
            for spec in specs:
                index = self._next_index()
                root = (self.dir / "devices" / f"{index:02d}-{spec.soc}").resolve()
                root.mkdir(parents=True, exist_ok=True)
                identity = make_identity(spec)
                create_device_root(root, identity)
                dev = self._spawn(root, port=0, soc=spec.soc, serialno=identity.serialno)
                self.devices.append(dev)
                started.append(dev)
                self._save()
                self._attach(dev)
        except BaseException:
            # Undo this call only: devices of an earlier up() stay.
            for dev in started:
                self.server.disconnect(dev.serial)
                self._kill_device(dev)
                self.devices.remove(dev)
            if started_server and not self.devices:
                self._stop_server_unless_shared()
                self.adb_started = False
            self._save()
            raise
        return started

    def ls(self) -> list[VirtualDeviceStatus]:
        states = self.server.devices() if self.server.is_running() else {}
        return [VirtualDeviceStatus(r, is_device_process(r.pid, r.root), states.get(r.serial, "absent"))
                for r in self.devices]

    def down(self) -> None:
        """Disconnect and end every device, stop the adb server if this farm started it and no
        other farm's device is on it, forget all. Works from any process, and after a crash; ends
        also what another process started or restarted in this home meanwhile (the state file)."""
        self._merge_state()
        running = self.server.is_running()
        for dev in self.devices:
            if running:
                self.server.disconnect(dev.serial)
            self._kill_device(dev)
        self.left_running_for = self._stop_server_unless_shared() if self.adb_started else []
        self.devices = []
        if self.left_running_for:  # still ours to stop: a later down() does, once it is unused
            self._save()
            return
        self.adb_started = False
        self.state_path.unlink(missing_ok=True)

    def device(self, serial: str) -> VirtualDeviceProcess:
        for r in self.devices:
            if serial in (r.serial, r.serialno):
                return r
        raise UsageError(f"no virtual device '{serial}' (have: "
                         f"{', '.join(r.serial for r in self.devices) or 'none'})")

    def set_slowdowns(self, serial: str, slowdowns: tuple[Slowdown, ...]) -> None:
        """A simulated phone's slowdown knobs (replacing its earlier ones), from its next run."""
        dev = self.device(serial)
        set_slowdowns(dev.root, load_identity(dev.root).props, slowdowns, confined=dev.confined)

    def host_path(self, serial: str, device_path: str) -> Path:
        """Where a path of a device's storage is on the host (see VirtualDeviceProcess.host_path)."""
        return self.device(serial).host_path(device_path)

    def processes(self, serial: str) -> list[int]:
        """Host pids of what runs inside a confined device (its commands, runners, sync workers):
        the processes in its pid namespace. Their cwd, seen from the host, is an Android path; this
        tells them from other devices' and the host's. Empty for an unconfined or stopped device."""
        dev = self.device(serial)
        view_pid = _read_run(dev.root).get("view_pid")
        if not view_pid or not is_device_process(dev.pid, dev.root):
            return []
        try:
            ns = os.stat(f"/proc/{view_pid}/ns/pid").st_ino
        except OSError:
            return []
        found = []
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and int(entry.name) != view_pid:
                try:
                    if os.stat(f"/proc/{entry.name}/ns/pid").st_ino == ns:
                        found.append(int(entry.name))
                except OSError:
                    continue  # gone meanwhile
        return found

    def kill(self, serial: str) -> None:
        """SIGKILL the device process (and its running commands), like a phone that dies."""
        self._kill_device(self.device(serial))

    def restart(self, serial: str) -> VirtualDeviceProcess:
        """Start a killed (or running) device again on the same port with the same state."""
        old = self.device(serial)
        self._kill_device(old)
        new = self._spawn(old.root, port=old.port, soc=old.soc, serialno=old.serialno)
        self.devices[self.devices.index(old)] = new
        self._save()
        # Re-attach now rather than waiting for the server's own retry (about 10 s).
        self.server.disconnect(new.serial)
        self._attach(new)
        return new

    def reboot(self, serial: str, timeout: float | None = None) -> VirtualDeviceProcess:
        """``adb reboot`` the device and wait until it is back ("device"): same process (it
        re-executes itself), port and storage; new namespaces, so nothing of the old boot runs."""
        dev = self.device(serial)
        timeout = timeout or self.start_timeout
        before = _read_run(dev.root).get("boot")
        try:  # the reboot: service, as `adb reboot` opens it (adbutils' reboot() runs a shell command)
            with self.client().device(dev.serial).open_transport(timeout=10) as conn:
                conn.send_command("reboot:")
                conn.check_okay()
                conn.read_until_close()
        except (adbutils.AdbError, OSError) as e:
            raise AdbError(f"reboot of {dev.serial} failed: {e}", serial=dev.serial) from None
        run: dict = {}

        def rebooted() -> bool:
            run.clear()
            run.update(_read_run(dev.root))
            return run.get("boot") not in (None, before)

        came_back = procs.wait_until(lambda: rebooted() or not is_device_process(dev.pid, dev.root),
                                     timeout)
        if not came_back or not is_device_process(dev.pid, dev.root):
            what = (f"did not come back from reboot within {timeout:g}s" if not came_back
                    else "exited during its reboot")
            raise InfraError(f"virtual device {dev.serial} {what}; log: {dev.root / DEVICE_LOG}: "
                             f"{procs.log_tail(dev.root / DEVICE_LOG)}", serial=dev.serial)
        new = VirtualDeviceProcess(serial=dev.serial, port=dev.port, pid=int(run["pid"]), root=dev.root,
                                   soc=dev.soc, serialno=dev.serialno,
                                   confined=bool(run.get("confined", True)))
        self.devices[self.devices.index(dev)] = new
        self._save()
        self.server.disconnect(new.serial)  # re-attach now, not at the server's next retry
        self._attach(new)
        return new

    def phone(self, serial: str) -> PhoneState:
        return load_phone(self.device(serial).root)

    def set_phone(self, serial: str, *, battery_level: int | None = None,
                  battery_temp_c: float | None = None, battery_status: str | None = None,
                  thermal: dict[str, float] | None = None) -> PhoneState:
        """Change the device's battery and thermal zones (what its sysfs and ``dumpsys battery``
        report), at once, running or not. ``thermal``: {zone type, thermal_zoneN or N: deg C}."""
        root = self.device(serial).root
        state = load_phone(root)
        changes = {k: v for k, v in (("battery_level", battery_level),
                                     ("battery_temp_c", battery_temp_c),
                                     ("battery_status", battery_status)) if v is not None}
        state = PhoneState(**{**state.to_json(), "thermal": state.thermal, **changes})
        for zone, temp in (thermal or {}).items():
            state = state.with_zone(zone, temp)
        save_phone(root, state)
        return state

    def set_faults(self, serial: str, **faults) -> None:
        """Switch faults on (see farm.virtual.faults.Faults); they take effect at the next stream."""
        try:
            parsed = Faults(**faults)
        except TypeError as e:
            raise UsageError(f"set_faults({serial}): {e}") from None
        write_faults(self.device(serial).root, parsed)

    def clear_faults(self, serial: str) -> None:
        write_faults(self.device(serial).root, NO_FAULTS)

    # Restarts of the farm's adb server by heal(), monotonic times (a tuple: reassigned, not shared).
    _adb_restarts: tuple[float, ...] = ()

    def heal(self, *, max_restarts: int = 3, per_s: float = 60.0) -> HealReport:
        """Bring the farm's own adb server back if it is down, and reconnect every virtual device
        whose process is still alive but which the server does not list (a restarted server knows
        no devices). Dead devices are left alone (and reported): they are offline until restarted;
        a device the server lists in another state than "device" is the server's to reconnect.

        Bounded: at most ``max_restarts`` server restarts within ``per_s`` seconds; one more is
        ``AdbServerDown`` naming the server, as is a server that cannot be started. Returns what was
        done; a healthy farm is left as it is (``report.changed`` is False).
        """
        report = HealReport(server=str(self.adb_server))
        # A server killed between answering and listing is down too: a beat that raced the kill
        # restarts it now rather than reporting an outage it could mend (the restart budget holds).
        for attempt in range(2):
            if not self.server.is_running():
                self._restart_server(report, max_restarts=max_restarts, per_s=per_s)
            try:
                listed = self.server.devices()
                break
            except AdbServerDown:
                if attempt or report.server_restarted:
                    raise  # down again right after a restart: the budget's business, not ours
        for dev in self.devices:
            if not is_device_process(dev.pid, dev.root):
                report.dead.append(dev.serial)
                continue
            if dev.serial in listed:
                continue  # "device", or a state the server itself tracks (offline: it reconnects)
            try:
                self._attach(dev)
            except AdbError as e:
                log.warning("heal: %s not reconnected: %s", dev.serial, e)
                report.failed[dev.serial] = str(e)
                continue
            report.reconnected.append(dev.serial)
        return report

    # --- internals ---------------------------------------------------------------------------
    def _restart_server(self, report: HealReport, *, max_restarts: int, per_s: float) -> None:
        now = time.monotonic()
        recent = tuple(t for t in self._adb_restarts if now - t < per_s)
        if len(recent) >= max_restarts:
            raise AdbServerDown(
                f"{self.server} is down again after {len(recent)} restarts within {per_s:g}s; "
                f"not restarting it (log: {self.server.home / 'server.log'})",
                server=str(self.adb_server))
        self._adb_restarts = (*recent, now)
        log.warning("%s is down; restarting it (restart %d within %gs)", self.server,
                    len(recent) + 1, per_s)
        report.server_restarted = self.server.ensure_running(timeout=self.start_timeout)
        if report.server_restarted and not self.adb_started:
            self.adb_started = True  # ours now: down() stops it
            self._save()

    def _merge_state(self) -> None:
        """Take in what another process recorded since this one read the state: a device it
        restarted (new pid) or started. Each device is known by its root."""
        try:
            state = self._read_state()
        except UsageError as e:  # ending what we know beats refusing to end anything
            log.warning("%s", e)
            return
        if state.get("adb_port") not in (None, self.server.port):
            return  # another farm's state (down() then up() elsewhere): not ours to merge
        mine = {dev.root: i for i, dev in enumerate(self.devices)}
        for raw in state.get("devices", []):
            dev = VirtualDeviceProcess.from_json(raw)
            if dev.root in mine:
                old = self.devices[mine[dev.root]]
                if old.pid != dev.pid:  # restarted elsewhere: end the old process too
                    self._kill_device(old)
                self.devices[mine[dev.root]] = dev
            else:
                self.devices.append(dev)
        self.adb_started = self.adb_started or bool(state.get("adb_started", False))

    def _stop_server_unless_shared(self) -> list[str]:
        """Stop the server this farm started, unless it lists devices that are not this farm's: a
        configured port other farm homes (or the host's phones) share stays up for them. Returns
        those devices (empty: stopped)."""
        mine = {dev.serial for dev in self.devices}
        try:
            others = sorted(set(self.server.devices()) - mine) if self.server.is_running() else []
        except AdbError:
            others = []  # it does not answer its device list: nobody is served by it
        if others:
            log.warning("%s: left running: it still serves %s, not this farm's",
                        self.server, ", ".join(others))
            return others
        self.server.stop()
        return []

    def _next_index(self) -> int:
        devices_dir = self.dir / "devices"
        existing = [int(p.name.split("-")[0]) for p in devices_dir.glob("*-*")
                    if p.name.split("-")[0].isdigit()] if devices_dir.exists() else []
        return max(existing, default=-1) + 1

    def _spawn(self, root: Path, port: int, soc: str, serialno: str) -> VirtualDeviceProcess:
        (root / RUN_FILE).unlink(missing_ok=True)
        proc = procs.spawn(device_argv(root, port, self.owner["pid"] if self.owner else None),
                           log_path=root / DEVICE_LOG, env=procs.farm_env(), cwd=root)
        self._procs[proc.pid] = proc
        run: dict = {}

        def listening() -> bool:
            try:
                run.update(json.loads((root / RUN_FILE).read_text()))
            except (OSError, ValueError):
                return False  # not written yet (or half written): ask again
            return run.get("pid") == proc.pid

        if procs.wait_until(lambda: listening() or proc.poll() is not None, self.start_timeout) \
                and run.get("pid") == proc.pid:
            return VirtualDeviceProcess(serial=f"127.0.0.1:{run['port']}", port=int(run["port"]),
                                       pid=proc.pid, root=root, soc=soc, serialno=serialno,
                                       confined=bool(run.get("confined", True)))
        procs.terminate(proc.pid, _device_owned(root), grace=0, proc=self._procs.pop(proc.pid))
        if proc.poll() == EXIT_UNCONFINABLE:
            raise ConfinementUnavailable(f"virtual device in {root} refused to start: "
                                         f"{procs.log_tail(root / DEVICE_LOG, lines=1)}")
        raise InfraError(f"virtual device in {root} did not start "
                         f"(exit {proc.poll()}); log: {root / DEVICE_LOG}: "
                         f"{procs.log_tail(root / DEVICE_LOG)}")

    def _attach(self, dev: VirtualDeviceProcess) -> None:
        self.server.connect(dev.serial)
        try:
            self.server.wait_for_state(dev.serial, "device", timeout=self.start_timeout)
        except AdbError as e:
            raise AdbError(f"{e}; device log: {dev.root / 'device.log'}",
                           serial=dev.serial) from None

    def _kill_device(self, dev: VirtualDeviceProcess) -> None:
        procs.terminate(dev.pid, _device_owned(dev.root), grace=0, timeout=5.0,
                        proc=self._procs.pop(dev.pid, None))
        # Commands of a device killed -9 outlive it (own sessions): end them as the phone would.
        kill_commands(dev.root / PGID_DIR)
        (dev.root / RUN_FILE).unlink(missing_ok=True)

    def _read_state(self) -> dict:
        try:
            return json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            raise UsageError(f"{self.state_path}: corrupt virtual farm state ({e}); "
                             f"delete it after ending its processes") from None

    def _save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        state = {"adb_port": self.server.port, "adb_started": self.adb_started,
                 "owner": self.owner, "devices": [r.to_json() for r in self.devices]}
        write_atomic(self.state_path, json.dumps(state, indent=1))


@dataclass
class HealReport:
    """What ``VirtualFarm.heal`` did: the server it checked, whether it restarted it, the devices it
    reconnected, those whose process is dead (left offline) and those it could not reconnect."""

    server: str
    server_restarted: bool = False
    reconnected: list[str] = field(default_factory=list)
    dead: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return self.server_restarted or bool(self.reconnected)


_confinement_checked = False


def check_confinement() -> None:
    """Once per process: can devices confine their commands here? ConfinementUnavailable naming what
    is missing, unless PTEFARM_VIRTUAL_UNCONFINED=1 (then devices run unconfined, as they announce)."""
    global _confinement_checked
    if _confinement_checked or unconfined_requested():
        return
    probe(find_tools())
    _confinement_checked = True


def _owner_of(pid: int) -> dict | None:
    """An owner process as the state records it: pid and start time (a reused pid is not it)."""
    try:
        return {"pid": pid, "started": psutil.Process(pid).create_time()}
    except psutil.Error:
        return None


def _live_owner(recorded: object) -> dict | None:
    """The recorded owner when that very process still runs, else None."""
    if not isinstance(recorded, dict) or not isinstance(recorded.get("pid"), int):
        return None
    now = _owner_of(recorded["pid"])
    return now if now is not None and now["started"] == recorded.get("started") else None


def _read_run(root: Path) -> dict:
    try:
        run = json.loads((root / RUN_FILE).read_text())
    except (OSError, ValueError):
        return {}  # not written yet, half written or gone: ask again
    return run if isinstance(run, dict) else {}


def _device_owned(root: Path) -> procs.Owned:
    return procs.cmdline_has(["farm.virtual.device"], ["--root", str(root)])


def is_device_process(pid: int, root: Path) -> bool:
    """True only for our device process on that root: a stale pid reused by another process is left
    alone."""
    return procs.is_ours(pid, _device_owned(root))
