"""The Android filesystem view of a virtual device, built with Linux namespaces through bubblewrap.

The device process (ours, trusted, speaking ADB) stays on the host. At start it creates one set of
namespaces per device with ``bwrap`` (user, mount, pid, ipc, uts; not net: the runner may need
loopback), held open by a tiny payload that lives as long as the device: its stdin is a pipe only the
device holds, and ``--die-with-parent`` covers a device killed -9. When that holder ends, its pid
namespace ends, and the kernel kills every command still inside.

Every shell command and every ``sync:`` session then *enters* those namespaces with util-linux
``nsenter`` as uid/gid 2000 (``shell``, as adbd runs commands). One namespace per device rather than
one ``bwrap`` per command, because a phone's shells share their pids and mounts: a later ``adb shell``
must be able to ``kill`` a runner an earlier one started (farm.execute.runprofile.kill_command does), and it
costs ~2 ms per command instead of ~12.

Inside, ``/`` is a read-only tmpfs that looks like Android::

    /data            the device's storage (R/data), read-write; /data/local/tmp exists
    /data/tombstones R/tombstones, read-only (written by the device's logd, as tombstoned does)
    /dev/socket      R/run/socket, read-only: logd's socket (logcat, log, the runner's wrapper)
    /dev/__properties__  R/run/props, read-only: the properties the device's boot set (getprop)
    /storage/emulated/0, /sdcard -> it   R/data/media/0
    /system          R/system, read-only: bin/ (sh = mksh, getprop, dumpsys, logcat, log, df, sha256sum,
                     farm-llama-runner), build.prop
    /vendor/lib64    empty
    /proc /dev       bwrap's own (this pid namespace's processes only)
    /sys             the host's, read-only, with the device's class/thermal and class/power_supply over it
    /tmp             private tmpfs
    /etc             passwd, group, hosts (synthetic) and the host's ld.so.cache
    /usr, /bin, /lib, /lib64, the venv, the base interpreter, the farm package: read-only, for Python

Nothing of the host is writable from inside; uid 2000 has no capabilities.

Degraded mode: where bwrap is missing or namespaces are refused, a device refuses to start naming what
is missing, unless ``PTEFARM_VIRTUAL_UNCONFINED=1``: then commands run on the host in the device root
as before, sync confines paths by realpath, and the device announces ``ro.ptefarm.confined=0``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import farm
from farm.errors import InfraError
from farm.virtual.logwire import SOCKET_REL, TOMBSTONES_REL

log = logging.getLogger(__name__)

UNCONFINED_ENV = "PTEFARM_VIRTUAL_UNCONFINED"  # "1": run devices without namespaces (degraded)
BWRAP_ENV = "PTEFARM_BWRAP"                    # the bwrap binary to use (default: bwrap on PATH)
SHELL_UID = 2000                               # AID_SHELL: what `adb shell` runs as on a phone

# Host side of a device root R (the rest of R is the device's own bookkeeping, outside the view).
STORAGE_REL = "data"             # -> /data (named as inside: farm.selftest.chaos watches R/data for files)
MEDIA_REL = "data/media/0"       # -> /storage/emulated/0 (where Android keeps it too)
SYSTEM_REL = "system"            # -> /system (read-only)
SYS_REL = "sys"                  # R/sys/class/{thermal,power_supply} -> /sys/class/...
ETC_REL = "etc"                  # synthetic passwd, group, hosts
PROPS_REL = "run/props"          # -> /dev/__properties__ (runtime properties, read by getprop)

ANDROID_PATH = "/system/bin:/vendor/bin:/usr/local/bin:/usr/bin:/bin"
SYS_CLASSES = ("thermal", "power_supply")
_READY = b"ptefarm-view-ready\n"


class ConfinementUnavailable(InfraError):
    """bwrap or nsenter is missing, or the kernel refuses the namespaces a device needs."""


def unconfined_requested() -> bool:
    return os.environ.get(UNCONFINED_ENV, "") == "1"


@dataclass(frozen=True)
class Tools:
    bwrap: str
    nsenter: str


def find_tools() -> Tools:
    """The bwrap and nsenter binaries, or ConfinementUnavailable naming what is missing."""
    bwrap = os.environ.get(BWRAP_ENV) or shutil.which("bwrap")
    nsenter = shutil.which("nsenter")
    missing = [what for what, path in (("bwrap (Debian package 'bubblewrap')", bwrap),
                                       ("nsenter (util-linux)", nsenter)) if not path]
    if missing or not os.access(bwrap, os.X_OK):  # type: ignore[arg-type]
        names = " and ".join(missing) or f"bwrap at {bwrap} (not executable)"
        raise ConfinementUnavailable(unavailable_message(f"{names} not found"))
    return Tools(bwrap=bwrap, nsenter=nsenter)  # type: ignore[arg-type]


def unavailable_message(why: str) -> str:
    return (f"virtual devices run their commands in Linux namespaces, which are not available here: "
            f"{why}. Install bubblewrap (apt-get install bubblewrap; ci/setup.sh does), allow user "
            f"namespaces (sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces), or set "
            f"{UNCONFINED_ENV}=1 to run devices unconfined on the host (degraded: commands can touch "
            f"the host; `farm devices` says 'unconfined')")


def probe(tools: Tools, timeout: float = 10.0) -> None:
    """One trivial sandbox with every namespace a device uses; ConfinementUnavailable if refused."""
    argv = [tools.bwrap, "--unshare-user", "--uid", str(SHELL_UID), "--gid", str(SHELL_UID),
            "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent",
            "--ro-bind", "/", "/", "--proc", "/proc", "--", "/bin/sh", "-c", "exit 0"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ConfinementUnavailable(unavailable_message(f"{tools.bwrap} could not run: {e}")) from None
    if done.returncode != 0:
        why = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        raise ConfinementUnavailable(unavailable_message(f"{tools.bwrap}: {why[0]}"))


def host_runtime_paths() -> tuple[Path, ...]:
    """Read-only host directories a device needs to run the host runner: the venv, the base
    interpreter, and the farm package itself (editable install: only ``farm/``, never the whole
    checkout, which may hold other devices' roots under .farm/)."""
    paths = [Path(sys.prefix), Path(sys.base_prefix), Path(farm.__file__).resolve().parent]
    exe = Path(sys.executable).resolve()  # a venv's python is a symlink into the base interpreter
    if not any(exe.is_relative_to(p) for p in paths):
        paths.append(exe.parent)
    unique: list[Path] = []
    for p in sorted({p.resolve() for p in paths if p.exists()}, key=lambda p: len(p.parts)):
        if not any(p.is_relative_to(u) for u in unique) and not Path("/usr").resolve() in p.parents:
            unique.append(p)
    return tuple(unique)


def _top_level_host_links() -> list[str]:
    """bwrap arguments for /bin, /lib, /lib64, /sbin: symlinks where the host has symlinks (merged
    /usr), read-only binds where it has directories."""
    args: list[str] = []
    for name in ("bin", "sbin", "lib", "lib32", "lib64"):
        host = Path("/") / name
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            args += ["--ro-bind", str(host), str(host)]
    return args


RUNNER_ZYGOTE_SOCKET = "/tmp/ptefarm-runner/zygote.sock"


@dataclass(frozen=True)
class AndroidView:
    """What a device's view is made of (host paths), and the bwrap arguments that build it."""

    root: Path                        # the device root R
    hostname: str                     # ro.product.device, as on a phone
    host_ro: tuple[Path, ...] = ()    # read-only host pieces bound at their own path (Python, farm)

    @property
    def storage(self) -> Path:
        return self.root / STORAGE_REL

    def bwrap_args(self) -> list[str]:
        r = self.root
        args = ["--unshare-user", "--uid", str(SHELL_UID), "--gid", str(SHELL_UID),
                "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", self.hostname,
                "--die-with-parent", "--new-session",
                "--tmpfs", "/",
                "--ro-bind", "/usr", "/usr", *_top_level_host_links(),
                "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
                # The device's logd socket and the properties its boot set: its process serves and
                # writes them from the host; read-only inside (a socket still takes connections).
                "--ro-bind", str(r / SOCKET_REL), "/dev/socket",
                "--ro-bind", str(r / PROPS_REL), "/dev/__properties__",
                "--bind", str(self.storage), "/data",
                # Written by the device's logd only, as tombstoned owns them on a phone.
                "--ro-bind", str(r / TOMBSTONES_REL), "/data/tombstones",
                "--bind", str(r / MEDIA_REL), "/storage/emulated/0",
                "--symlink", "/storage/emulated/0", "/sdcard",
                "--ro-bind", str(r / SYSTEM_REL), "/system",
                "--dir", "/vendor/lib64", "--dir", "/vendor/bin",
                "--ro-bind", str(r / ETC_REL / "passwd"), "/etc/passwd",
                "--ro-bind", str(r / ETC_REL / "group"), "/etc/group",
                "--ro-bind", str(r / ETC_REL / "hosts"), "/etc/hosts"]
        # The dynamic loader's cache (the host's Python), and Debian's alternatives (awk, which, ...).
        for etc in ("/etc/ld.so.cache", "/etc/alternatives"):
            if Path(etc).exists():
                args += ["--ro-bind", etc, etc]
        host_sys = Path("/sys/class")
        if all((host_sys / c).is_dir() for c in SYS_CLASSES):
            # The host's /sys (cpu topology, for torch), with the device's own phone state over it.
            args += ["--ro-bind", "/sys", "/sys"]
            for c in SYS_CLASSES:
                args += ["--ro-bind", str(r / SYS_REL / "class" / c), f"/sys/class/{c}"]
        else:  # no mount points to bind over (sysfs cannot get new directories): the device's only
            args += ["--ro-bind", str(r / SYS_REL), "/sys"]
        for p in self.host_ro:
            args += ["--ro-bind", str(p), str(p)]
        # Last: everything above is mounted, now nothing but /data and /tmp stays writable.
        return args + ["--remount-ro", "/", "--chdir", "/"]

    def command_env(self) -> dict[str, str]:
        """The environment of commands inside, as adbd gives it (plus what Python needs)."""
        env = {
            "PATH": ANDROID_PATH,
            "HOME": "/",
            "TMPDIR": "/data/local/tmp",
            "ANDROID_DATA": "/data",
            "ANDROID_ROOT": "/system",
            "EXTERNAL_STORAGE": "/sdcard",
            "HOSTNAME": self.hostname,
            "USER": "shell",
            "LOGNAME": "shell",
            "SHELL": "/system/bin/sh",
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",  # the farm package is read-only inside
            # This checkout's farm first, as procs.farm_env does for the device process itself.
            "PYTHONPATH": str(Path(farm.__file__).resolve().parent.parent),
            # farm-llama-runner forks its runs from a zygote that imported torch once, started by the
            # device's first run in the device's private /tmp (it dies with the device's namespaces).
            "PTEFARM_RUNNER_ZYGOTE": RUNNER_ZYGOTE_SOCKET,
            "PTEFARM_RUNNER_ZYGOTE_SPAWN": "1",
        }
        return env


class Namespaces:
    """The namespaces of one running device: started once, entered by every command."""

    def __init__(self, view: AndroidView, tools: Tools):
        self.view = view
        self.tools = tools
        self._holder: subprocess.Popen | None = None
        self.pid: int | None = None  # host pid of the namespaces' init (what nsenter targets)

    def start(self, timeout: float = 20.0) -> None:
        """Create the namespaces. Call from the main thread: ``--die-with-parent`` is tied to the
        thread that forks bwrap, not to the process."""
        info_r, info_w = os.pipe()
        argv = [self.tools.bwrap, *self.view.bwrap_args(), "--info-fd", str(info_w), "--",
                "/bin/sh", "-c", f"printf {_READY.decode().strip()}'\\n' && read -r _"]
        try:
            self._holder = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, pass_fds=(info_w,))
        except OSError as e:
            os.close(info_r)
            os.close(info_w)
            raise ConfinementUnavailable(unavailable_message(f"{argv[0]}: {e}")) from None
        os.close(info_w)
        with os.fdopen(info_r, "rb") as info:
            raw = info.read()  # bwrap closes it once the child is set up
        # The payload prints only after every mount and the uid map are in place: entering before
        # that would race bwrap's own set-up.
        ready = self._holder.stdout.readline() if self._holder.stdout else b""
        if ready != _READY:
            err = self._holder.stderr.read().decode(errors="replace").strip() if self._holder.stderr \
                else ""
            self.stop()
            raise ConfinementUnavailable(
                f"the Android view of {self.view.root} could not be set up: {err or 'no output'} "
                f"(bwrap {' '.join(self.view.bwrap_args())})")
        try:
            self.pid = int(json.loads(raw)["child-pid"])
        except (ValueError, KeyError, TypeError) as e:
            self.stop()
            raise ConfinementUnavailable(f"bwrap --info-fd gave {raw[:200]!r}: {e}") from None
        log.info("Android view of %s up: namespaces of pid %d", self.view.root, self.pid)

    def enter_argv(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the view, as uid/gid 2000 with cwd ``/``. ``--wd`` without a value:
        the holder's cwd (``/`` inside); never ``--wd=/``, which nsenter opens on the host."""
        if self.pid is None:
            raise RuntimeError("namespaces not started")
        return [self.tools.nsenter, "-t", str(self.pid), "--user", "--mount", "--pid", "--uts",
                "--ipc", "--root", "--wd", "-S", str(SHELL_UID), "-G", str(SHELL_UID), "--", *argv]

    def alive(self) -> bool:
        return self._holder is not None and self._holder.poll() is None

    def stop(self) -> None:
        """End the namespaces (and with them every command still running inside)."""
        holder, self._holder = self._holder, None
        if holder is None:
            return
        for pipe in (holder.stdin, holder.stdout, holder.stderr):
            if pipe is not None:
                pipe.close()  # the payload's `read` sees EOF: it ends, bwrap's pid 1 with it
        try:
            holder.wait(timeout=5)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()
