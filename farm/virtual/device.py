"""A virtual Snapdragon device: one process speaking the device side of ADB over TCP on loopback.

    python -m farm.virtual.device --root R [--port P] [--exit-with-pid PID]

Everything about the device is in its root directory R (laid out by :mod:`farm.virtual.identity`):
``spec.json`` (properties, free space), ``phone.json`` (battery, thermals), ``data/`` (its
``/data``), ``faults.json`` (optional). At start it checks that it can confine its commands
(farm.virtual.confine; exit 3 naming what is missing, unless PTEFARM_VIRTUAL_UNCONFINED=1), writes
``system/`` and creates its Android view. This process stays on the host; every shell command and
every sync session runs inside the view. Once listening it writes ``run.json`` with its pid, port and
whether it is confined; the manager waits for that file.

``adb reboot`` (the ``reboot:`` service) re-executes this process: same pid and port, same storage,
new namespaces; the adb server sees the device go and come back.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from farm import procs
from farm.errors import UsageError
from farm.fileio import write_atomic
from farm.virtual.confine import (
    PROPS_REL,
    STORAGE_REL,
    AndroidView,
    ConfinementUnavailable,
    Namespaces,
    find_tools,
    host_runtime_paths,
    probe,
    unconfined_requested,
)
from farm.virtual.faults import NO_FAULTS, Faults, clear_at_boot, read_faults
from farm.virtual.identity import (
    DeviceIdentity,
    device_shell,
    install_system,
    load_identity,
    runtime_props,
    write_runtime_props,
)
from farm.virtual.logd import LogDaemon
from farm.virtual.logwire import SOCKET_NAME, SOCKET_REL, TOMBSTONES_REL
from farm.virtual.protocol import (
    A_CLSE,
    A_CNXN,
    A_OKAY,
    A_OPEN,
    A_VERSION,
    A_WRTE,
    MAX_PAYLOAD,
    ProtocolError,
    Transport,
    device_banner,
)
from farm.virtual.shell import CommandContext, kill_commands, parse_shell_service, run_shell
from farm.virtual.simphone import HeatRenderer, current_timing, install_timing, is_simulated
from farm.virtual.stream import Link, Stream
from farm.virtual.syncd import header as syncd_header
from farm.virtual.syncpump import WarmWorkers, serve_sync

RUN_FILE = "run.json"
PGID_DIR = "run/commands"
EXIT_UNCONFINABLE = 3   # the device cannot confine its commands (and was not told to run without)
REBOOT_DOWN_S = 1.0     # how long a rebooting device stays away: the server must notice it went
# Set once the boot is over (before that, getprop answers them empty, as during a phone's boot).
BOOT_PROPS = {"sys.boot_completed": "1", "dev.bootcomplete": "1", "service.bootanim.exit": "1",
              "init.svc.adbd": "running", "init.svc.logd": "running", "sys.usb.state": "adb"}
log = logging.getLogger("farm.virtual.device")  # also when run as __main__


def device_argv(root: Path, port: int = 0, exit_with_pid: int | None = None) -> list[str]:
    """The command line of a device process (start it with :func:`farm.procs.farm_env`)."""
    owner = ["--exit-with-pid", str(exit_with_pid)] if exit_with_pid is not None else []
    return procs.module_argv("farm.virtual.device", "--root", str(root), "--port", str(port), *owner)


def unconfined_env(root: Path) -> dict[str, str]:
    """Environment of an unconfined device's commands (degraded mode): host paths into its root for
    the tools (getprop, dumpsys read these variables), then the venv, then the system PATH."""
    system_path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    storage = root / STORAGE_REL
    return {
        "PATH": os.pathsep.join([str(root / "system" / "bin"), os.path.dirname(sys.executable),
                                 system_path]),
        "HOME": str(storage),
        "TMPDIR": str(storage / "local" / "tmp"),
        "LANG": "C.UTF-8",
        "ANDROID_DATA": str(storage),
        "ANDROID_ROOT": str(root / "system"),
        "PTEFARM_SYSFS": str(root / "sys"),
        "PTEFARM_VIRTUAL_ROOT": str(root),
        "PTEFARM_PROPS": str(root / PROPS_REL),
        "PTEFARM_LOGD_SOCKET": str(root / SOCKET_REL / SOCKET_NAME),
        "PYTHONPATH": procs.farm_env({})["PYTHONPATH"],
    }


class VirtualDevice:
    """One device. ``confined``: its commands and sync sessions run inside its Android view (the
    namespaces are created here, so construct it on the main thread)."""

    def __init__(self, root: Path, identity: DeviceIdentity, *, confined: bool):
        self.root = root
        self.identity = identity
        self.confined = confined
        self.props = runtime_props(identity, root, confined)
        install_system(root, self.props, identity.free_bytes)
        self.banner = device_banner(identity.props)
        self.link = Link()  # the slow_bytes_per_s fault's rate, shared by all of the device's streams
        (root / PGID_DIR).mkdir(parents=True, exist_ok=True)
        (root / STORAGE_REL / TOMBSTONES_REL).mkdir(parents=True, exist_ok=True)  # a mount point
        self.logd = LogDaemon(root, self.props)
        self.logd.start()  # before the view: its socket directory is bound into it
        self.logd.write("main", "I", "init", "init first stage started!")
        self.namespaces: Namespaces | None = None
        if confined:
            view = AndroidView(root=root, hostname=identity.props.get("ro.product.device", "android"),
                               host_ro=host_runtime_paths())
            self.namespaces = Namespaces(view, find_tools())
            self.namespaces.start()
            self.ctx = CommandContext(cwd=root, env=view.command_env(), pgid_dir=root / PGID_DIR,
                                      shell="/system/bin/sh", enter=self.namespaces.enter_argv)
        else:
            self.ctx = CommandContext(cwd=root, env=unconfined_env(root), pgid_dir=root / PGID_DIR,
                                      shell=device_shell())
        self.ctx.env.update(install_timing(root, self.props, confined=confined))
        self.heat = HeatRenderer(root, current_timing(root).heat) if is_simulated(self.props) else None
        if self.heat is not None:
            self.heat.start()
        self.sync_workers = WarmWorkers(self.sync_argv(), self.ctx.env, cwd=self.ctx.cwd)
        self._listener: socket.socket | None = None
        self._stopping = threading.Event()
        self.reboot_requested = threading.Event()
        self._transports: set[Transport] = set()
        self._transports_lock = threading.Lock()

    def complete_boot(self) -> None:
        """What the end of a phone's boot sets: sys.boot_completed and its companions (a script's
        ``while [[ -z $(getprop sys.boot_completed) ]]`` loop ends here)."""
        write_runtime_props(self.root, BOOT_PROPS)
        self.logd.write("system", "I", "ActivityManager", "Boot completed: sys.boot_completed=1")
        log.info("boot completed")

    def sync_argv(self) -> list[str]:
        """The sync worker: inside the view, or confined by path on the host."""
        argv = [sys.executable, "-S", "-m", "farm.virtual.syncd"]
        if not self.confined:
            argv += ["--confine", str(self.root / STORAGE_REL)]
        return self.ctx.enter(argv)

    def sync_header(self, faults: Faults) -> bytes:
        """A session's limits, fixed when it opens: the largest file a push may write."""
        limit = min((n for n in (faults.disk_full_after_bytes, self.identity.free_bytes)
                     if n is not None), default=None)
        return syncd_header(limit)

    def faults(self) -> Faults:
        try:
            return read_faults(self.root)
        except UsageError as e:
            log.error("%s; running without faults", e)
            return NO_FAULTS

    # --- listening -----------------------------------------------------------------------------
    def listen(self, port: int) -> int:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(8)
        self._listener = sock
        return sock.getsockname()[1]

    def serve_forever(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                break
            if self._stopping.is_set():  # stopping (a reboot): a phone that is going away answers none
                conn.close()
                break
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
                conn.setsockopt(socket.SOL_SOCKET, opt, 4 * 1024 * 1024)
            threading.Thread(target=self._serve_connection, args=(conn,), daemon=True).start()

    def stop(self) -> None:
        self._stopping.set()
        if self.heat is not None:
            self.heat.stop()
        if self._listener is not None:
            try:  # wakes the accept() of serve_forever (a close alone does not, on Linux)
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError as e:
                log.debug("listener shutdown: %s", e)
            self._listener.close()
        kill_commands(self.root / PGID_DIR)
        self.logd.stop()
        self.sync_workers.close()
        if self.namespaces is not None:
            self.namespaces.stop()  # ends whatever still runs inside

    # --- one transport (TCP connection from the adb server) ----------------------------------
    def drop_connections(self) -> None:
        """Close every transport at once, as a phone that goes away does: the server lists the
        device offline, and its clients' streams end."""
        with self._transports_lock:
            transports = list(self._transports)
        for transport in transports:
            transport.close()

    def _serve_connection(self, sock: socket.socket) -> None:
        transport = Transport(sock)
        with self._transports_lock:
            self._transports.add(transport)
        streams: dict[int, Stream] = {}
        lock = threading.Lock()
        ids = itertools.count(1)

        def finished(local_id: int) -> None:
            with lock:
                streams.pop(local_id, None)

        try:
            while True:
                msg = transport.read_message()
                if msg.command == A_CNXN:
                    transport.max_payload = min(msg.arg1 or MAX_PAYLOAD, MAX_PAYLOAD)
                    transport.send(A_CNXN, A_VERSION, MAX_PAYLOAD, self.banner, with_checksum=True)
                elif msg.command == A_OPEN:
                    self._open(transport, msg.arg0, bytes(msg.payload), streams, lock, ids, finished)
                elif msg.command == A_OKAY:
                    with lock:
                        stream = streams.get(msg.arg1)
                    if stream is not None:
                        stream.on_okay()
                elif msg.command == A_WRTE:
                    with lock:
                        stream = streams.get(msg.arg1)
                    if stream is None:
                        continue
                    stream.deliver(msg.payload)
                    limit = stream.faults.drop_after_bytes
                    if limit is not None and stream.bytes_received > limit:
                        log.warning("fault drop_after_bytes=%d: dropping the connection", limit)
                        break
                elif msg.command == A_CLSE:
                    with lock:
                        stream = streams.pop(msg.arg1, None)
                    if stream is not None:
                        stream.on_remote_close()
                # AUTH and anything else: ignored (we never ask for authentication).
        except (EOFError, OSError, ProtocolError) as e:
            log.info("connection ended: %s", e)
        finally:
            transport.close()
            with self._transports_lock:
                self._transports.discard(transport)
            with lock:
                orphans = list(streams.values())
                streams.clear()
            for stream in orphans:
                stream.on_remote_close()

    def _open(self, transport: Transport, remote_id: int, payload: bytes,
              streams: dict[int, Stream], lock: threading.Lock, ids, finished) -> None:
        service = payload.rstrip(b"\0").decode("utf-8", "surrogateescape")
        faults = self.faults()
        if service == "sync:":
            header = self.sync_header(faults)

            def target(stream: Stream) -> None:
                serve_sync(stream, self.sync_workers, header)
        elif (request := parse_shell_service(service)) is not None:
            def target(stream: Stream) -> None:
                run_shell(stream, request, self.ctx)
        elif service.startswith("reboot:"):
            def target(stream: Stream) -> None:
                # Like adbd: the connection drops at once (the client's `adb reboot` returns with
                # the device already offline), then the device is away for a moment.
                log.info("reboot requested (%r)", service)
                self.reboot_requested.set()
                self.stop()  # serve_forever returns; main() re-executes the process
                self.drop_connections()
        else:
            log.info("refusing service %r", service)
            transport.send(A_CLSE, 0, remote_id)
            return
        local_id = next(ids)
        stream = Stream(transport, local_id, remote_id, faults, finished, self.link)
        with lock:
            streams[local_id] = stream
        transport.send(A_OKAY, local_id, remote_id)
        threading.Thread(target=target, args=(stream,), daemon=True).start()


def _write_run_file(root: Path, port: int, device: VirtualDevice) -> None:
    # "boot": tells a reboot (same pid) from the previous boot; "view_pid": a process inside the
    # device's namespaces, so the farm can tell the device's processes from the host's.
    view_pid = device.namespaces.pid if device.namespaces is not None else None
    write_atomic(root / RUN_FILE, json.dumps({"pid": os.getpid(), "port": port,
                                              "confined": device.confined, "boot": time.time_ns(),
                                              "view_pid": view_pid}))


def decide_confinement() -> bool:
    """True: confine (bwrap works here). False: run unconfined, as PTEFARM_VIRTUAL_UNCONFINED=1 asks.
    ConfinementUnavailable otherwise, naming what is missing."""
    if unconfined_requested():
        log.warning("PTEFARM_VIRTUAL_UNCONFINED=1: commands run on the host, unconfined (degraded)")
        return False
    probe(find_tools())
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m farm.virtual.device",
                                     description="Run one virtual Snapdragon device.")
    parser.add_argument("--root", type=Path, required=True, help="device root directory")
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: any)")
    parser.add_argument("--exit-with-pid", type=int, default=None,
                        help="exit when this process is gone")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s")
    root = args.root.resolve()
    try:
        confined = decide_confinement()
        device = VirtualDevice(root, load_identity(root), confined=confined)
    except ConfinementUnavailable as e:
        print(f"farm.virtual.device: {root}: {e}", file=sys.stderr)
        return EXIT_UNCONFINABLE
    except (UsageError, OSError) as e:
        print(f"farm.virtual.device: {root}: {e}", file=sys.stderr)
        return 2
    try:
        port = device.listen(args.port)
    except OSError as e:
        device.stop()
        print(f"farm.virtual.device: {root}: port {args.port}: {e}", file=sys.stderr)
        return 2

    def stop_and_exit() -> None:
        device.stop()
        os._exit(0)

    signal.signal(signal.SIGTERM, lambda signum, frame: stop_and_exit())
    signal.signal(signal.SIGINT, lambda signum, frame: stop_and_exit())
    if args.exit_with_pid:
        # A test session killed -9 leaves nothing behind.
        procs.watch_owner(args.exit_with_pid, stop_and_exit)
    if clear_at_boot(root):
        device.logd.write("system", "I", "init", "boot: the wedged shell of the last boot is gone")
    delay_ms = device.faults().boot_completed_delay_ms
    if delay_ms is None:
        device.complete_boot()  # before run.json: whoever waits for the device finds it booted
    else:  # listening (adb sees the device) while still booting, as a phone's adbd is
        threading.Timer(delay_ms / 1000, device.complete_boot).start()
    _write_run_file(root, port, device)
    log.info("device %s listening on 127.0.0.1:%d (%s)", device.identity.props["ro.serialno"], port,
             "confined" if confined else "UNCONFINED")
    device.serve_forever()
    if device.reboot_requested.is_set():
        # Same pid (the manager keeps tracking it), same port and storage; new namespaces. Our
        # sockets are close-on-exec: the server sees the transport drop and reconnects by itself.
        time.sleep(REBOOT_DOWN_S)
        log.info("rebooting")
        sys.stderr.flush()
        argv = device_argv(root, port, args.exit_with_pid)
        os.execv(argv[0], argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
