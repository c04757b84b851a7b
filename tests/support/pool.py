"""Fixtures for the device pool on both backends, and a worker process for contention tests.

``pool_url`` is parametrized over SQLite (a file in tmp_path) and PostgreSQL (a fresh schema in the
database of ``$PTEFARM_TEST_PG_URL``, dropped at teardown, so parallel runs never share tables). The
PostgreSQL variant is skipped only when ``PTEFARM_TEST_PG_URL`` is set to the empty string; an
unreachable server is a test error, so CI cannot silently lose half of the pool tests.

Run as a module, this file is the worker the contention tests start many times:
    python -m tests.support.pool contend URL NAME '{"priority": 10, ...}'
    python -m tests.support.pool hold URL '{"serial": "dev0"}' TTL HEARTBEAT
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from farm.device.probe import DeviceInfo
from farm.pool.leases import HolderClock
from farm.selftest.postgres import PG_ENV, pg_base_url, with_search_path

REPO = Path(__file__).resolve().parents[2]
# How long a test waits for what should happen at once (a heartbeat's beat, a waiter's grant, a
# thread's end): generous, for a loaded CI host. ci/mutation.sh sets it lower: each mutant that breaks
# the thing waited for costs this bound before it counts as killed.
PROMPT_S = float(os.environ.get("PTEFARM_TEST_PROMPT_S", "30"))


def fake_device(serial: str, soc: str = "SM8650", htp_arch: str | None = "v75", *,
                server: str = "127.0.0.1:15037", virtual: bool = True, tags: tuple[str, ...] = (),
                state: str = "device") -> DeviceInfo:
    """A discovery record (what farm.devices.discover would report) for ``Pool.sync``."""
    return DeviceInfo(serial=serial, server=server, state=state, soc=soc, htp_arch=htp_arch,
                      model=f"Virtual {soc}", virtual=virtual, tags=tags)


class HandClock(HolderClock):
    """A lease holder's clock that moves only when the test sets ``t``: deadlines on it are exact.
    Given a pool, the pool's clock moves with it (``Store.clock_offset_s``): a TTL runs out, or is
    renewed in time, on both sides at once, and nobody sleeps through it."""

    def __init__(self, t: float = 1000.0, *, pool: Any = None) -> None:
        self._store = pool.store if pool is not None else None
        self._t = t

    @property
    def t(self) -> float:
        return self._t

    @t.setter
    def t(self, value: float) -> None:
        if self._store is not None:
            self._store.clock_offset_s += value - self._t
        self._t = value

    def now(self) -> float:
        return self._t


class BeatClock(HandClock):
    """A hand clock whose waits (each one heartbeat's interval) pass at once, moving the clock on by
    the interval, and are recorded. After ``beats`` waits (None: never) time stops: the next wait
    lasts until the heartbeat is stopped, so the test reads a settled lease."""

    def __init__(self, *, pool: Any = None, beats: int | None = None) -> None:
        super().__init__(pool=pool)
        self.waits: list[float] = []
        self.beats = threading.Semaphore(0)
        self._budget = beats

    def wait(self, event: threading.Event, seconds: float) -> bool:
        if self._budget is not None and len(self.waits) >= self._budget:
            return event.wait(60)
        self.waits.append(seconds)
        self.t += seconds
        self.beats.release()
        return event.wait(0.01)


@pytest.fixture
def sqlite_pool_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'pool.db'}"


@pytest.fixture
def pg_pool_url() -> Iterator[str]:
    """A PostgreSQL pool URL in a schema of its own, dropped afterwards."""
    base = pg_base_url()
    if base is None:
        pytest.skip(f"{PG_ENV} is empty: PostgreSQL pool tests disabled")
    import psycopg

    schema = f"ptefarm_test_{secrets.token_hex(6)}"
    try:
        admin = psycopg.connect(base, autocommit=True, connect_timeout=10)
    except psycopg.Error as e:
        raise RuntimeError(f"PostgreSQL at {base} (from ${PG_ENV} or its default) is unreachable: "
                           f"{e}; run ci/start-postgres.sh, or set {PG_ENV}= to skip") from e
    with admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        try:
            yield with_search_path(base, schema)
        finally:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def pool_url(request: pytest.FixtureRequest) -> str:
    """A fresh, empty pool on each backend in turn."""
    name = "sqlite_pool_url" if request.param == "sqlite" else "pg_pool_url"
    return request.getfixturevalue(name)


@pytest.fixture
def pool_cli(pool_url, tmp_path, monkeypatch):
    """Run ``farm pool ... --url POOL`` in a clean environment; returns (exit code, stdout, stderr)."""
    from click.testing import CliRunner

    from farm.cli.main import main

    monkeypatch.delenv("PTEFARM_CONFIG", raising=False)
    monkeypatch.setenv("PTEFARM_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)

    def run(*args: str) -> tuple[int, str, str]:
        result = CliRunner().invoke(main, ["pool", "--url", pool_url, *args])
        if result.exception and not isinstance(result.exception, SystemExit):
            raise result.exception
        return result.exit_code, result.stdout, result.stderr

    return run


@pytest.fixture
def pool(pool_url: str) -> Iterator[Any]:
    from farm.pool import Pool

    with Pool.open(pool_url, poll_s=0.02) as p:
        yield p


def worker_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "tests.support.pool", *args]


def start_worker(*args: str, **popen: Any) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen(worker_command(*args), cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)


@contextlib.contextmanager
def reaped(procs: dict[str, subprocess.Popen]) -> Iterator[dict[str, subprocess.Popen]]:
    """Whatever happens in the block (a failed assertion, a timeout), no worker outlives it."""
    try:
        yield procs
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


def collect(procs: dict[str, subprocess.Popen], timeout: float = 300) -> dict[str, tuple[str, str]]:
    """(stdout, stderr) of every worker once it has exited."""
    return {name: p.communicate(timeout=timeout) for name, p in procs.items()}


def check_event_log(events: list[Any], devices: dict[str, Any]) -> dict[str, int]:
    """Replay the pool's event log and assert the two invariants of leasing.

    1. Never two holders: per device, ``leased`` alternates with the end (released/expired) of that
       same lease.
    2. Queue order: when a lease is granted on device D, no waiter then in the queue ranks ahead of the
       grantee (higher priority, or equal priority and earlier arrival) and could have used D.
    ``devices``: serial -> DeviceRecord (for matching). Returns counts, so callers can check the
    replay was not vacuous.
    """
    from farm.pool import LeaseRequest

    holder_of: dict[str, str | None] = {}
    waiting: dict[int, LeaseRequest] = {}
    counts = {"leased": 0, "from_queue": 0, "ended": 0, "passed_over": 0}
    for e in events:
        if e.kind == "queued":
            waiting[e.queue_id] = LeaseRequest.from_json(e.detail)
        elif e.kind in ("gave_up", "abandoned"):
            waiting.pop(e.queue_id, None)
        elif e.kind == "leased":
            assert holder_of.get(e.serial) is None, \
                f"event {e.id}: {e.serial} leased to {e.token} while {holder_of[e.serial]} holds it"
            holder_of[e.serial] = e.token
            request = LeaseRequest.from_json(e.detail)
            rank = (-request.priority, e.queue_id if e.queue_id is not None else float("inf"))
            for qid, other in waiting.items():
                if qid == e.queue_id:
                    continue
                if (-other.priority, qid) < rank:
                    assert not other.matches(devices[e.serial]), \
                        (f"event {e.id}: {e.serial} went to {request.describe()} (queue {e.queue_id}) "
                         f"although waiter {qid} ({other.describe()}) was ahead and could use it")
                    counts["passed_over"] += 1
            if waiting.pop(e.queue_id, None) is not None:
                counts["from_queue"] += 1
            counts["leased"] += 1
        elif e.kind in ("released", "expired"):
            assert holder_of.get(e.serial) == e.token, \
                f"event {e.id}: {e.kind} of {e.token} on {e.serial}, held by {holder_of.get(e.serial)}"
            holder_of[e.serial] = None
            counts["ended"] += 1
    return counts


# -- worker side ----------------------------------------------------------------------------------

def _contend(url: str, name: str, spec_json: str) -> int:
    """Lease ``cycles`` times; each time prove exclusivity with an O_EXCL marker file per device.

    Prints one JSON line per request: served (with serial and token) or timeout.
    """
    from farm.errors import LeaseTimeout
    from farm.pool import Holder, LeaseRequest, Pool

    spec = json.loads(spec_json)
    request = LeaseRequest(**spec["request"])
    markers = Path(spec["markers"])
    go = Path(spec["go"])
    with Pool.open(url, poll_s=spec.get("poll_s", 0.02)) as pool:
        (Path(spec["ready"]) / name).touch()
        while not go.exists():  # start together, so that they really contend
            time.sleep(0.005)
        for i in range(spec["cycles"]):
            holder = Holder.current(purpose=f"{name}#{i}")
            try:
                lease = pool.acquire(request, holder, ttl_s=spec["ttl_s"], timeout_s=spec["timeout_s"])
            except LeaseTimeout as e:
                print(json.dumps({"worker": name, "outcome": "timeout", "message": str(e)}), flush=True)
                continue
            with lease:
                marker = markers / lease.serial
                try:
                    fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    print(json.dumps({"worker": name, "outcome": "double", "serial": lease.serial}),
                          flush=True)
                    return 1
                os.write(fd, name.encode())
                os.close(fd)
                time.sleep(spec["hold_s"])
                os.unlink(marker)
            print(json.dumps({"worker": name, "outcome": "served", "serial": lease.serial,
                              "token": lease.token}), flush=True)
    return 0


def _hold(url: str, request_json: str, ttl_s: str, heartbeat_s: str) -> int:
    """Lease one device, print its token, keep it alive with the heartbeat until killed."""
    from farm.pool import LeaseRequest, Pool

    pool = Pool.open(url)
    lease = pool.acquire(LeaseRequest(**json.loads(request_json)), ttl_s=float(ttl_s), timeout_s=30,
                         heartbeat_s=float(heartbeat_s))
    lease.start_heartbeat()
    print(json.dumps({"token": lease.token, "serial": lease.serial, "pid": os.getpid()}), flush=True)
    while True:
        time.sleep(3600)


def _use(url: str, name: str, spec_json: str) -> int:
    """Lease ``cycles`` times and run a shell command on each leased device through the adb server
    the pool names for it: proof that a lease leads to a usable device on whichever host has it."""
    from farm.config import AdbServerAddress
    from farm.device.probe import Device
    from farm.device.transport import client_for
    from farm.pool import Holder, LeaseRequest, Pool

    spec = json.loads(spec_json)
    with Pool.open(url, poll_s=0.02) as pool:
        for i in range(spec["cycles"]):
            with pool.acquire(LeaseRequest(**spec["request"]), Holder.current(f"{name}#{i}"),
                              ttl_s=30, timeout_s=60) as lease:
                host, _, port = lease.server.rpartition(":")
                server = AdbServerAddress(host, int(port))
                soc = Device(client_for(server), lease.serial, server).shell(
                    "getprop ro.soc.model", timeout=20, check=True).out.strip()
                time.sleep(spec["hold_s"])
            print(json.dumps({"worker": name, "serial": lease.serial, "server": lease.server,
                              "soc": soc, "token": lease.token}), flush=True)
    return 0


def main(argv: list[str]) -> int:
    if argv[0] == "use":
        return _use(*argv[1:])
    if argv[0] == "contend":
        return _contend(*argv[1:])
    if argv[0] == "hold":
        return _hold(*argv[1:])
    raise SystemExit(f"unknown worker mode {argv[0]!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
