"""A zygote for `farm-llama-runner`: import torch once, fork a runner per request.

    python -m farm.runner.zygote --socket /run/dev1/zygote.sock [--exit-with-pid PID]
    PTEFARM_RUNNER_ZYGOTE=/run/dev1/zygote.sock farm-llama-runner --model_path ... (as ever)

Importing torch and ExecuTorch's runtime is ~2 s of a ~2.1 s `tiny` run. The zygote (as Android's) pays
that once per device: it imports, binds a Unix socket and, for each client, forks a child that runs the
runner in the client's place: the client's stdin/stdout/stderr and working directory (passed as file
descriptors), argv, environment, umask, CPU affinity and ignored signals. The client is
`farm-llama-runner` itself (:func:`run_remote`, called by farm/runner/main.py before it imports
anything heavy); it waits for the child's exit status and exits with it (128+N for a signal).

Protocol (SOCK_SEQPACKET, so each message is one JSON datagram and a closed peer reads as b""):
    client -> zygote   {"argv": [...], "env": {...}, ...} + fds [stdin, stdout, stderr, cwd]
    zygote -> client   {"pid": N} once the child runs, or {"error": "..."} (the client runs in-process)
    client -> zygote   {"signal": N}: SIGINT/SIGTERM/SIGHUP the client got, for the child
    zygote -> client   {"exit": code} or {"signal": N} when the child is gone
The client closing its end (killed with its process group by the farm's run timeout) makes the zygote
SIGKILL the child's process group: the run never outlives the command that started it.

The zygote is single-threaded on purpose: a fork copies only the forking thread, and a lock held by any
other thread at that moment would stay locked in the child forever. (numpy's OpenBLAS starts a thread
at import; its own fork handler stops it first.) It never runs inference: torch's OpenMP pool starts
lazily, with the first parallel op, so each child creates its own, sized as a fresh process would.

Written by hand on the standard library (socket.send_fds, os.pidfd_open, selectors): multiprocessing's
forkserver can preload torch, but it serves the Python process that started it, running functions;
it cannot take a run from an unrelated command with that command's stdio, cwd and environment.

Permissions: anyone who can connect to the socket runs code as the zygote's user, with the zygote's
view of the filesystem. Put the socket in a directory that only the device's commands can reach (mode
0700, owned by the user that runs them); the socket itself is made 0600 and a peer of another uid is
refused. Start the zygote where the device's commands run (same mount namespace, or at least the same
paths): argv's absolute paths are opened by the child, in the zygote's namespace; the cwd is passed
as a descriptor and so is always the client's. Unix socket paths are limited to 107 bytes.

Entry points for whoever starts one per device: :func:`zygote_argv` and :func:`wait_ready`.
This module's top level imports only the standard library: the client side must start in milliseconds.
"""

from __future__ import annotations

import errno
import json
import os
import selectors
import signal
import socket
import stat
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from farm.runner import PROG

ZYGOTE_ENV = "PTEFARM_RUNNER_ZYGOTE"  # a zygote's socket, for farm-llama-runner: run there, fast
MAX_MSG = 1 << 20  # the request carries the environment; 1 MiB is far beyond any real one
STARTED_TIMEOUT_S = 10.0  # a live zygote forks in milliseconds; past this the client runs in-process
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # what a terminal or a timeout sends
TICK_S = 0.2  # how often the zygote checks its socket file and its owner


# --- for the integrator ---------------------------------------------------------------------------

STARTING_SUFFIX = ".starting"


def zygote_argv(socket_path: str | os.PathLike, exit_with_pid: int | None = None) -> list[str]:
    """The command line of a zygote serving ``socket_path`` (run it with farm.procs.farm_env())."""
    owner = ["--exit-with-pid", str(exit_with_pid)] if exit_with_pid is not None else []
    return [sys.executable, "-m", __name__, "--socket", str(socket_path), *owner]


def wait_ready(socket_path: str | os.PathLike, timeout: float) -> bool:
    """True once a zygote answers on ``socket_path`` (its socket appears only after the imports)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with _connect(str(socket_path), timeout=1.0):
                return True  # the zygote reads the immediate close as "no request" and forgets it
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


def start_detached(socket_path: str | os.PathLike, stale_s: float = 120.0) -> bool:
    """Start a zygote for ``socket_path`` in the background, in a session of its own (the command
    that starts it may be killed with its process group); False when one is already starting. A
    ``<socket>.starting`` marker keeps concurrent first runs from starting one each; the zygote removes
    it once it serves, and a marker older than ``stale_s`` (a zygote that died importing) is ignored.
    Its stderr goes to ``<socket>.log``. The socket's directory is made private (0700)."""
    import subprocess

    path = os.path.abspath(socket_path)
    marker = path + STARTING_SUFFIX
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        if time.time() - os.stat(marker).st_mtime < stale_s:
            return False
        os.unlink(marker)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        with open(path + ".log", "ab") as log_file:
            subprocess.Popen(zygote_argv(path), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=log_file, start_new_session=True, close_fds=True)
    except OSError:
        return False
    return True


# --- client (farm-llama-runner) -------------------------------------------------------------------

class NotAnswering(Exception):
    """The zygote could not take the run; nothing ran, so the caller runs it in-process."""


# sun_path holds 108 bytes with its NUL; a deeper path (a test's or CI's temporary directory) is
# reached through the directory's descriptor instead.
SUN_PATH_MAX = 107


@contextmanager
def _unix_address(path: str) -> Iterator[str]:
    """``path``, or where it is too long for a Unix socket address, the same file named through
    ``/proc/self/fd/N/`` of its directory opened with O_PATH (bind and connect resolve it the same)."""
    if len(os.fsencode(path)) <= SUN_PATH_MAX:
        yield path
        return
    directory, name = os.path.split(os.path.abspath(path))
    fd = os.open(directory, os.O_PATH | os.O_DIRECTORY)
    try:
        short = f"/proc/self/fd/{fd}/{name}"
        if len(os.fsencode(short)) > SUN_PATH_MAX:
            raise OSError(errno.ENAMETOOLONG, f"socket name too long: {name!r}")
        yield short
    finally:
        os.close(fd)


def _connect(path: str, timeout: float | None) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.settimeout(timeout)
        with _unix_address(path) as address:
            sock.connect(address)
    except BaseException:
        sock.close()
        raise
    return sock


def _recv_json(sock: socket.socket) -> dict | None:
    data = sock.recv(MAX_MSG)
    return json.loads(data) if data else None


def _std_fds() -> tuple[list[int], list[int]]:
    """Our fds 0, 1, 2 (a closed one stands in as /dev/null) and the cwd; second: fds to close."""
    fds, opened = [], []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            opened.append(os.open(os.devnull, os.O_RDWR))
            fds.append(opened[-1])
    # The cwd goes as a descriptor: it works when it was deleted or when the zygote sees other paths.
    opened.append(os.open(".", os.O_PATH | os.O_DIRECTORY))
    return fds + [opened[-1]], opened


def _request() -> dict:
    umask = os.umask(0)
    os.umask(umask)
    return {"argv0": sys.argv[0], "env": dict(os.environ), "umask": umask,
            "cpus": sorted(os.sched_getaffinity(0)), "ignored": _ignored()}


def _ignored() -> list[int]:
    """The forwarded signals this process ignores: the child ignores them too, and they are not passed on."""
    return [int(s) for s in FORWARDED if signal.getsignal(s) == signal.SIG_IGN]


def run_remote(socket_path: str, argv: list[str], prog: str = PROG) -> int:
    """Run the runner with ``argv`` in a child of the zygote at ``socket_path``; its exit code.
    (``prog`` names the command in the one error a client prints: another zygote's client, such as
    the plugin's xdist workers', is not farm-llama-runner.)

    Raises NotAnswering when the zygote did not start the run (nothing ran). Once it has, the client
    only waits: the signals it gets are passed on, and its death kills the child.
    """
    try:
        sock = _connect(socket_path, timeout=STARTED_TIMEOUT_S)
    except OSError as e:
        raise NotAnswering(f"{type(e).__name__}: {e.strerror or e}") from None
    with sock:
        relay = _SignalRelay(sock)
        try:
            _start(sock, argv)
        except NotAnswering:
            relay.restore()
            raise
        relay.started()
        try:
            status = _recv_json(sock)
        except (OSError, ValueError):
            status = None
    if status is None:
        print(f"{prog}: error: the zygote at {socket_path} went away during the run",
              file=sys.stderr)
        return 1
    return status["exit"] if "exit" in status else 128 + status["signal"]


def _start(sock: socket.socket, argv: list[str]) -> None:
    """Send the request with our stdio and cwd; return once the zygote says the child runs."""
    fds, opened = _std_fds()
    try:
        # argv and env are str with surrogateescape'd bytes; JSON's \udcxx escapes carry them.
        socket.send_fds(sock, [json.dumps({**_request(), "argv": argv}).encode()], fds)
        reply = _recv_json(sock)
    except (OSError, ValueError) as e:
        raise NotAnswering(f"{type(e).__name__}: {e}") from None
    finally:
        for fd in opened:
            os.close(fd)
    if not reply or "pid" not in reply:
        raise NotAnswering((reply or {}).get("error", "closed the connection"))
    sock.settimeout(None)


class _SignalRelay:
    """The client's SIGINT/SIGTERM/SIGHUP are for the run: held until the child exists, then sent on.
    If the zygote does not take the run, they are restored and the held ones delivered to us."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.pending: list[int] | None = []
        self.previous = {sig: signal.signal(sig, self._on_signal)
                         for sig in FORWARDED if sig not in _ignored()}

    def _on_signal(self, signum: int, _frame) -> None:
        if self.pending is None:
            self._send(signum)
        else:
            self.pending.append(signum)

    def _send(self, signum: int) -> None:
        try:
            self.sock.send(json.dumps({"signal": signum}).encode())
        except OSError:
            pass  # the run is ending anyway

    def started(self) -> None:
        pending, self.pending = self.pending, None
        for signum in pending:
            self._send(signum)

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        for signum in self.pending or []:
            os.kill(os.getpid(), signum)


# --- zygote ---------------------------------------------------------------------------------------

def preload_runner() -> None:
    """Everything a run imports, so that a child imports nothing. Import only: no inference here."""
    import torch  # noqa: F401

    import farm.runner.cli  # noqa: F401
    from farm.model import tokenizer
    from farm.runner import engine

    tokenizer.preload()

    engine.import_runtime().Runtime.get()


def _libc_prctl():
    import ctypes

    return ctypes.CDLL(None, use_errno=True).prctl


class Zygote:
    def __init__(self, path: str, owner_pid: int | None,
                 run: Callable[[dict], int] | None = None):
        self.path = path
        # What a child does once it has become its client: the runner's run, or (for the plugin's
        # worker zygote, ptefarm_fixtures.workers) an xdist worker's interpreter.
        self.run = run or run_runner
        self.sel = selectors.DefaultSelector()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.conns: dict[socket.socket, int | None] = {}  # client -> its child's pid, once forked
        self.pidfds: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (child pid, client)
        self.prctl = _libc_prctl()
        self.pid = os.getpid()
        self.identity: tuple[int, int] | None = None  # our socket file's (st_dev, st_ino), once bound
        self.owner_alive = None
        if owner_pid is not None:
            from farm.procs import owner_alive

            self.owner_alive = owner_alive(owner_pid)

    def bind(self) -> None:
        """Bind beside the path and rename into place: the path answers as soon as it exists."""
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with _unix_address(tmp) as address:
            self.listener.bind(address)
        os.chmod(tmp, 0o600)
        self.listener.listen(64)
        os.rename(tmp, self.path)
        st = os.stat(self.path)
        self.identity = (st.st_dev, st.st_ino)
        self.listener.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ, self._accept)

    def still_wanted(self) -> bool:
        """False once our socket file is removed or replaced, or the owner process is gone."""
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        if (st.st_dev, st.st_ino) != self.identity:
            return False
        return self.owner_alive is None or self.owner_alive()

    def serve(self) -> None:
        while self.still_wanted():
            for key, _events in self.sel.select(TICK_S):
                key.data(key.fileobj)

    def close(self) -> None:
        """Remove the socket file if it is still ours; children die with us (PDEATHSIG)."""
        try:
            st = os.stat(self.path)
            if (st.st_dev, st.st_ino) == self.identity:
                os.unlink(self.path)
        except OSError:
            pass

    def _accept(self, listener: socket.socket) -> None:
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        if int.from_bytes(creds[4:8], sys.byteorder) != os.getuid():
            _send(conn, {"error": "refused: the client runs as another user"})
            conn.close()
            return
        conn.setblocking(False)
        self.conns[conn] = None
        self.sel.register(conn, selectors.EVENT_READ, self._from_client)

    def _from_client(self, conn: socket.socket) -> None:
        try:
            data, fds, _flags, _addr = socket.recv_fds(conn, MAX_MSG, 4)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, fds = b"", []
        pid = self.conns[conn]
        try:
            msg = json.loads(data) if data else None
        except ValueError:
            msg = {}
        if pid is None and isinstance(msg, dict) and len(fds) == 4 and {"argv", "env"} <= msg.keys():
            self._start(conn, msg, fds)
            return
        for fd in fds:
            os.close(fd)
        if msg is None:  # the client is gone (or it was wait_ready's probe): so is its run
            if pid is not None:
                _kill_group(pid)  # reaped when its pidfd fires
            self._drop(conn)
        elif pid is None:
            _send(conn, {"error": "not a run request"})
            self._drop(conn)
        elif isinstance(msg, dict) and msg.get("signal") in FORWARDED:
            try:
                os.kill(pid, msg["signal"])
            except ProcessLookupError:
                pass

    def _start(self, conn: socket.socket, request: dict, fds: list[int]) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as e:
            for fd in fds:
                os.close(fd)
            _send(conn, {"error": f"fork: {e.strerror}"})
            self._drop(conn)
            return
        if pid == 0:
            self._child(request, fds)  # never returns
        for fd in fds:
            os.close(fd)
        try:
            os.setpgid(pid, pid)  # also done by the child: whichever runs first, the group exists
        except OSError:
            pass
        pidfd = os.pidfd_open(pid)
        self.conns[conn] = pid
        self.pidfds[pidfd] = (pid, conn)
        self.sel.register(pidfd, selectors.EVENT_READ, self._child_exited)
        _send(conn, {"pid": pid})

    def _child_exited(self, pidfd: int) -> None:
        pid, conn = self.pidfds.pop(pidfd)
        self.sel.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        if conn in self.conns:
            sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
            _send(conn, {"signal": sig} if sig else {"exit": os.waitstatus_to_exitcode(status)})
            self._drop(conn)

    def _drop(self, conn: socket.socket) -> None:
        self.sel.unregister(conn)
        del self.conns[conn]
        conn.close()

    # --- in the child ---

    def _child(self, request: dict, fds: list[int]) -> None:
        code = 1
        try:
            self._become_client(request, fds)
            code = self.run(request)
        except SystemExit as e:  # as the interpreter would map it
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
            os._exit(code)

    def _become_client(self, request: dict, fds: list[int]) -> None:
        """Turn this fork of the zygote into the process the client would have been."""
        # Die with the zygote: a child whose client cannot be told any more has no one to run for.
        self.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != self.pid:  # the zygote died before prctl took effect
            os._exit(1)
        os.setpgid(0, 0)  # our own group, so the zygote's kill reaches anything we start
        for sock in (self.listener, *self.conns):
            sock.close()
        for pidfd in self.pidfds:
            os.close(pidfd)
        self.sel.close()
        stdin, stdout, stderr, cwd = fds
        for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
            os.dup2(fd, target)
        os.fchdir(cwd)
        for fd in set(fds) - {0, 1, 2}:
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.umask(request["umask"])
        try:
            os.sched_setaffinity(0, request["cpus"])
        except OSError:
            pass  # CPUs the zygote's cgroup does not have: keep the zygote's
        sys.argv = [request.get("argv0", PROG), *request["argv"]]
        # Python's start-up dispositions (SIGINT -> KeyboardInterrupt, SIGPIPE ignored), then the
        # signals the client had ignored; nothing blocked.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        for sig in request.get("ignored", []):
            signal.signal(sig, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        # stdout is line-buffered on a terminal, block-buffered elsewhere: decided at start-up
        # for the zygote's own stdout, so decided again for the client's.
        sys.stdout.reconfigure(line_buffering=os.isatty(1))


def run_runner(request: dict) -> int:
    """A runner zygote's child: the run farm-llama-runner would have made in-process."""
    from farm.runner import cli

    _reseed()
    _set_threads()
    return cli.exit_code(request["argv"])


def _reseed() -> None:
    """Each run gets the fresh-process state of the global random generators, not a zygote's copy."""
    import random

    import torch

    random.seed()  # a fresh interpreter seeds from os.urandom
    # torch's default CPU generator starts from a fixed seed. (Not torch.manual_seed: it also seeds
    # the accelerator back-ends, importing their modules, ~30 ms of a run for nothing here.)
    torch.default_generator.manual_seed(torch.initial_seed())
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def _set_threads() -> None:
    """torch's intra-op thread count as a fresh process would pick it: OpenMP reads OMP_NUM_THREADS
    when it is loaded (here: the zygote's environment, not the client's), else uses every CPU the
    process may run on (the client's affinity, set just before)."""
    import torch

    raw = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    n = int(raw) if raw.isdigit() and int(raw) > 0 else len(os.sched_getaffinity(0))
    torch.set_num_threads(n)


def _send(conn: socket.socket, msg: dict) -> None:
    try:
        conn.setblocking(True)  # tiny messages: a live client's buffer never fills
        conn.send(json.dumps(msg).encode())
        conn.setblocking(False)
    except OSError:
        pass  # the client is gone; its EOF is handled by the selector


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _open_stdio() -> None:
    """/dev/null for a closed fd 0, 1 or 2: a child dup2s the client's stdio onto 0-2, and a received
    fd must not have landed on one of them."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)  # takes the lowest free number: fd
            setattr(sys, ("stdin", "stdout", "stderr")[fd], open(fd, "r" if fd == 0 else "w",
                                                                 closefd=False))


def _socket_in_use(path: str) -> bool:
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            return True  # not a socket: not ours to replace
    except FileNotFoundError:
        return False
    try:
        with _connect(path, timeout=1.0):
            return True
    except OSError:
        return False


def main(argv: list[str] | None = None, *, prog: str = "python -m farm.runner.zygote",
         description: str = "Serve farm-llama-runner runs from one import.",
         preload: Callable[[], None] | None = None, run: Callable[[dict], int] | None = None) -> int:
    """Serve a zygote until its socket is removed or its owner exits. Another zygote (the plugin's
    xdist workers') passes its own ``preload`` and ``run``; the defaults are the runner's."""
    import argparse  # not at the top: the client imports this module and never parses

    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--socket", required=True, help="Unix socket path (appears once ready)")
    parser.add_argument("--exit-with-pid", type=int, default=None,
                        help="exit when this process is gone")
    args = parser.parse_args(argv)
    prog = prog.removeprefix("python -m ")  # what its messages call it
    path = os.path.abspath(args.socket)
    if _socket_in_use(path):
        print(f"{prog}: {path}: in use by a live zygote or not a socket", file=sys.stderr)
        return 2
    _open_stdio()
    (preload or preload_runner)()
    import gc

    # Objects from the imports never die: keep them out of the collector's passes, so that a child's
    # collections do not write to (and copy) every page the zygote shares with it.
    gc.freeze()
    zygote = Zygote(path, args.exit_with_pid, run)

    zygote_pid = os.getpid()

    def stop(signum, _frame):
        if os.getpid() != zygote_pid:  # a child between fork and resetting its handlers
            os._exit(128 + signum)
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        if os.path.exists(path):
            os.unlink(path)  # a stale socket of a zygote that died
        zygote.bind()
        try:
            os.unlink(path + STARTING_SUFFIX)  # start_detached's marker: started, serving
        except OSError:
            pass
        zygote.serve()
    except OSError as e:
        print(f"{prog}: {path}: {e.strerror or e}", file=sys.stderr)
        return 2
    finally:
        zygote.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
