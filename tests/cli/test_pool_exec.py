"""``farm pool exec`` and ``farm pool lease --format env``: shell and CI leases, on both pool backends.

Each test runs the real ``farm`` command in a subprocess (signals, exit codes and the environment its
command sees are the point), against a pool seeded with fixed device records.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from farm.errors import LeaseTimeout
from farm.pool import Pool
from farm.pool.leases import HolderClock, fence_clock
from tests.support.pool import REPO, fake_device, reaped

FARM = [sys.executable, "-P", "-m", "farm.cli.main"]
SHOW_ENV = ("import json, os; print(json.dumps({k: os.environ.get(k) for k in ('ANDROID_SERIAL', "
            "'ADB_SERVER_SOCKET', 'ANDROID_ADB_SERVER_HOST', 'ANDROID_ADB_SERVER_PORT', 'PTEFARM_LEASE')}))")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("PTEFARM_CONFIG", "PTEFARM_LEASE")}
    return {**environ, "PTEFARM_HOME": str(tmp_path / "home"),
            "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


@pytest.fixture
def seeded(pool_url: str) -> str:
    with Pool.open(pool_url) as p:
        p.sync([fake_device("dev0", server="127.0.0.1:15037")])
    return pool_url


def farm(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*FARM, *args], env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


def events(url: str) -> list[str]:
    with Pool.open(url) as p:
        return [e.kind for e in p.history(serial="dev0", limit=None)]


def state(url: str) -> str:
    with Pool.open(url) as p:
        return {d.device.serial: d.device.state for d in p.status().devices}["dev0"]


def test_exec_passes_the_device_environment_and_the_exit_code(seeded, env):
    ran = farm(env, "pool", "exec", "--url", seeded, "--soc", "SM8650", "--timeout", "10", "--",
               sys.executable, "-c", f"{SHOW_ENV}; raise SystemExit(7)")
    assert ran.returncode == 7, ran.stderr
    seen = json.loads(ran.stdout)
    assert seen["ANDROID_SERIAL"] == "dev0"
    assert seen["ADB_SERVER_SOCKET"] == "tcp:127.0.0.1:15037"
    assert (seen["ANDROID_ADB_SERVER_HOST"], seen["ANDROID_ADB_SERVER_PORT"]) == ("127.0.0.1", "15037")
    assert len(seen["PTEFARM_LEASE"]) == 32
    assert "leased dev0" in ran.stderr and "released dev0" in ran.stderr
    assert events(seeded) == ["added", "leased", "released"]
    assert state(seeded) == "available"

    # Options after the command are the command's; a command killed by signal N is 128+N.
    ok = farm(env, "pool", "exec", "--url", seeded, "--", "sh", "-c", 'echo "$0 $1"', "--soc", "x")
    assert (ok.returncode, ok.stdout) == (0, "--soc x\n"), ok.stderr
    killed = farm(env, "pool", "exec", "--url", seeded, "--", "sh", "-c", "kill -KILL $$")
    assert killed.returncode == 128 + signal.SIGKILL
    missing = farm(env, "pool", "exec", "--url", seeded, "--", "no-such-command-xyz")
    assert missing.returncode == 2 and "no-such-command-xyz: cannot run" in missing.stderr
    assert state(seeded) == "available"


def test_exec_outlives_a_ttl_shorter_than_its_command(seeded, env):
    """The heartbeat renews a 2 s lease through a 6 s command: never expired, never lost."""
    ran = farm(env, "pool", "exec", "--url", seeded, "--ttl", "2", "--", "sleep", "6")
    assert ran.returncode == 0, ran.stderr
    kinds = events(seeded)
    assert "expired" not in kinds and kinds == ["added", "leased", "released"]
    with Pool.open(seeded) as p:
        released = [e for e in p.history(serial="dev0") if e.kind == "released"][0]
        leased = [e for e in p.history(serial="dev0") if e.kind == "leased"][0]
    assert released.at - leased.at >= 6


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_the_command_and_releases_the_lease(seeded, env, tmp_path, signum):
    pid_file = tmp_path / "child.pid"
    proc = subprocess.Popen(
        [*FARM, "pool", "exec", "--url", seeded, "--", "sh", "-c", 'echo $$ > "$0"; sleep 120 & wait',
         str(pid_file)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text().strip():
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
            time.sleep(0.05)
        child = int(pid_file.read_text())
        assert state(seeded) == "leased"
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signum, err  # sh died of the forwarded signal
    assert "released dev0" in err
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # the command is gone, and with its process group its `sleep` too
    assert state(seeded) == "available"
    assert events(seeded) == ["added", "leased", "released"]


def test_a_signal_while_waiting_leaves_the_queue(seeded, env):
    with Pool.open(seeded) as p:
        held = p.acquire(ttl_s=60, timeout_s=5)
        proc = subprocess.Popen([*FARM, "pool", "exec", "--url", seeded, "--timeout", "60", "--",
                                 "true"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        with reaped({"exec": proc}):
            deadline = time.monotonic() + 30
            while not p.status().queue:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130 and "interrupted (SIGTERM) while waiting" in err
        assert p.status().queue == []  # left at once, not dropped as stale later
        p.release(held.token)


def test_lease_format_env_exports_for_child_processes(seeded, env):
    script = (f'eval "$({" ".join(FARM)} pool lease --url "$URL" --soc SM8650 --format env)" && '
              f'{sys.executable} -c "{SHOW_ENV}" && farm_release_token="$PTEFARM_LEASE" && '
              f'{" ".join(FARM)} pool release --url "$URL" "$farm_release_token" >&2')
    ran = subprocess.run(["bash", "-c", script], env={**env, "URL": seeded}, capture_output=True,
                         text=True, timeout=60, check=False)
    assert ran.returncode == 0, ran.stderr
    seen = json.loads(ran.stdout)  # what a child process sees: exported, not shell-local
    assert seen["ANDROID_SERIAL"] == "dev0" and seen["ADB_SERVER_SOCKET"] == "tcp:127.0.0.1:15037"
    assert seen["ANDROID_ADB_SERVER_PORT"] == "15037" and len(seen["PTEFARM_LEASE"]) == 32
    assert "dev0: released" in ran.stderr


def test_lease_token_alone_on_stdout_serial_on_stderr(seeded, env):
    ran = subprocess.run(["bash", "-c", f'TOKEN=$({" ".join(FARM)} pool lease --url "$URL") && '
                                        f'echo "token=$TOKEN"'],
                         env={**env, "URL": seeded}, capture_output=True, text=True, timeout=60,
                         check=False)
    assert ran.returncode == 0, ran.stderr
    token = ran.stdout.strip().removeprefix("token=")
    assert len(token) == 32 and token.isalnum()
    assert "leased dev0 (SM8650, v75, virtual)" in ran.stderr and token in ran.stderr
    with Pool.open(seeded) as p:
        p.release(token)


def _started(proc: subprocess.Popen, marker: Path) -> None:
    deadline = time.monotonic() + 30
    while not marker.exists():
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)


def test_a_deleted_pool_file_stops_its_holder_and_leases_nothing_again(sqlite_pool_url, env, tmp_path):
    """`rm pool.db` under a running `farm pool exec`: the holder is told (its command stopped, exit
    3, as for any lease lost), and a new request is a pool error, not a fresh pool that leases dev0
    to a second holder while the first still uses it."""
    with Pool.open(sqlite_pool_url) as p:
        p.sync([fake_device("dev0", server="127.0.0.1:15037")])
    started, stopped = tmp_path / "started", tmp_path / "stopped"
    holder = subprocess.Popen(
        [*FARM, "pool", "exec", "--url", sqlite_pool_url, "--ttl", "3", "--", "sh", "-c",
         'trap \'echo stopped > "$1"; exit 143\' TERM; touch "$0"; while :; do sleep 0.1; done',
         str(started), str(stopped)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with reaped({"holder": holder}):
        _started(holder, started)
        Path(sqlite_pool_url.removeprefix("sqlite:///")).unlink()

        second = farm(env, "pool", "exec", "--url", sqlite_pool_url, "--timeout", "5", "--", "true")
        assert second.returncode == 3, second.stderr
        assert "pool.db is gone" in second.stderr and "pool.db.id" in second.stderr

        _, err = holder.communicate(timeout=60)
    assert holder.returncode == 3, err
    assert "deleted" in err and stopped.read_text().strip() == "stopped"


@pytest.mark.parametrize("remove", ["pool.db", "pool.db pool.db.id"])
def test_a_pool_deleted_under_a_command_that_ends_before_any_heartbeat_is_exit_3(
        sqlite_pool_url, env, tmp_path, remove):
    """The command removes the pool (and its note) and exits 0 long before the heartbeat (TTL 60 s,
    a beat every 20 s) could notice: the end of the command is checked too, so the run is exit 3,
    never the command's 0 with a warning."""
    db = Path(sqlite_pool_url.removeprefix("sqlite:///"))
    with Pool.open(sqlite_pool_url) as p:
        p.sync([fake_device("dev0", server="127.0.0.1:15037")])
    ran = farm(env, "pool", "exec", "--url", sqlite_pool_url, "--ttl", "60", "--", "sh", "-c",
               'cd "$0" && rm -f -- $1', str(db.parent), remove)
    assert ran.returncode == 3, ran.stderr
    assert "deleted" in ran.stderr and "not trusted" in ran.stderr


def test_a_lease_released_under_a_command_that_ends_at_once_is_exit_3(seeded, env):
    """Someone ends the lease (`farm pool release` of its token) while its command runs, and the
    command exits 0 before a heartbeat: the refused release says the lease ended under it, exit 3."""
    ran = farm(env, "pool", "exec", "--url", seeded, "--ttl", "60", "--", "sh", "-c",
               '"$0" -P -m farm.cli.main pool release --url "$1" "$PTEFARM_LEASE"', sys.executable, seeded)
    assert ran.returncode == 3, ran.stderr
    assert "not trusted" in ran.stderr
    assert state(seeded) == "available"


class SteppedClock(HolderClock):
    """A holder's clock that the test steps back, as a faked or restored clock goes back: a reading
    and a wait both follow it (a wait begun before the step lasts the step longer)."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.stores: list = []  # the holder's pool stores, for a step of its wall clock too

    def now(self) -> float:
        return fence_clock() - self.offset

    def step_wall_clock(self, seconds: float) -> None:
        """The holder's wall clock goes back too (a whole process's clock, as a faked or restored
        clock is): on SQLite, its pool clock is that wall clock."""
        for store in self.stores:
            store.clock_offset_s -= seconds

    def wait(self, event: threading.Event, seconds: float) -> bool:
        until = self.now() + seconds
        while not event.wait(0.02):
            if self.now() >= until:
                return False
        return True


@pytest.fixture
def stepped_exec(sqlite_pool_url, tmp_path, monkeypatch):
    """``farm pool exec`` in this process with its holder clock a SteppedClock; its command traps
    SIGTERM (writes "stopped"). Returns (clock, start(ttl) -> thread, started marker, stopped
    marker, result dict: exit code and stderr)."""
    from click.testing import CliRunner

    import farm.cli.pool as cli_pool
    from farm.cli.main import main

    with Pool.open(sqlite_pool_url) as p:
        p.sync([fake_device("dev0", server="127.0.0.1:15037")])
    monkeypatch.delenv("PTEFARM_CONFIG", raising=False)
    monkeypatch.delenv("PTEFARM_LEASE", raising=False)
    monkeypatch.setenv("PTEFARM_HOME", str(tmp_path / "home"))
    clock = SteppedClock()
    opened = cli_pool._open

    def with_clock(config=None):
        pool = opened(config)
        pool.clock = clock
        clock.stores.append(pool.store)
        return pool

    monkeypatch.setattr(cli_pool, "_open", with_clock)
    monkeypatch.setattr(cli_pool, "_signals", lambda on_signal: contextlib.nullcontext())
    started, stopped = tmp_path / "started", tmp_path / "stopped"
    result: dict = {}

    def start(ttl: str) -> threading.Thread:
        def run() -> None:
            ran = CliRunner().invoke(main, [
                "pool", "exec", "--url", sqlite_pool_url, "--ttl", ttl, "--", "sh", "-c",
                'trap \'echo stopped > "$1"; exit 143\' TERM; touch "$0"; '
                'i=0; while [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done', str(started), str(stopped)])
            result.update(code=ran.exit_code, stderr=ran.stderr, exception=ran.exception)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not started.exists():
            assert time.monotonic() < deadline and thread.is_alive(), result
            time.sleep(0.05)
        return thread

    return clock, start, stopped, result


def test_a_holder_whose_clock_steps_back_keeps_its_lease(stepped_exec, sqlite_pool_url):
    """The clock goes back an hour under a 2 s lease: the heartbeat's wait would last an hour, but the
    holder notices the step and renews on the pool's clock, so nobody else gets dev0 meanwhile."""
    clock, start, stopped, result = stepped_exec
    thread = start("2")
    clock.offset = 3600.0
    with Pool.open(sqlite_pool_url) as p, pytest.raises(LeaseTimeout):
        p.acquire(ttl_s=30, timeout_s=5)  # more than twice the TTL
    thread.join(60)
    assert result["code"] == 0, result
    assert not stopped.exists()
    assert "expired" not in events(sqlite_pool_url)


def test_a_holder_whose_clock_steps_back_is_told_its_lease_ended(stepped_exec, sqlite_pool_url):
    """The pool ends the lease (it expired: the heartbeat stalled) and gives dev0 to another job as
    the holder's clock goes back an hour: by its own clock its fence deadline is an hour away and
    its heartbeat waits an hour, yet it is told at once: its command stopped, exit 3."""
    clock, start, stopped, result = stepped_exec
    thread = start("30")
    with Pool.open(sqlite_pool_url) as p:
        with p.store.write() as txn:
            txn.run("UPDATE leases SET expires = {now} - 1 WHERE ended IS NULL")
        clock.offset = 3600.0
        other = p.acquire(ttl_s=60, timeout_s=5)
        thread.join(60)
        assert not thread.is_alive()
        assert result["code"] == 3, result
        assert "lost" in result["stderr"] and stopped.read_text().strip() == "stopped"
        p.release(other.token)


def test_a_holder_whose_whole_clock_steps_back_is_stopped_not_renewed_into_the_past(stepped_exec,
                                                                                  sqlite_pool_url):
    """The holder's clocks, its wall clock too, go back an hour: on SQLite its renewal would write an
    expiry an hour in the past for every other process, which would give dev0 away under it while it
    went on and exited 0. The renewal is refused instead, the command stopped, exit 3."""
    clock, start, stopped, result = stepped_exec
    thread = start("30")
    clock.step_wall_clock(3600.0)
    clock.offset = 3600.0
    thread.join(60)
    assert not thread.is_alive()
    assert result["code"] == 3, result
    assert "went back" in result["stderr"] and stopped.read_text().strip() == "stopped"
    with Pool.open(sqlite_pool_url) as p:
        [lease] = [e for e in p.history(serial="dev0") if e.kind == "leased"]
        assert "expired" not in events(sqlite_pool_url)
        assert p.status().devices[0].lease is None or p.status().devices[0].lease.expires > time.time()


def test_exec_puts_the_farms_adb_first_on_path(seeded, env, tmp_path):
    """Upstream's scripts (SimpleADB) run plain ``adb``: under ``farm pool exec`` that is the farm's
    bundled adb, ahead of any other on PATH, and it reaches the leased device's server through the
    exported ANDROID_ADB_SERVER_PORT / ADB_SERVER_SOCKET (SimpleADB takes no port)."""
    import adbutils

    # An adb on PATH that is no working adb (adbutils, hence the farm, passes it over): the command
    # must still meet the farm's own, not this one.
    decoy = tmp_path / "decoy-bin"
    decoy.mkdir()
    (decoy / "adb").write_text("#!/bin/sh\necho decoy adb; exit 1\n")
    (decoy / "adb").chmod(0o755)
    env = {**env, "PATH": f"{decoy}{os.pathsep}{env.get('PATH', '')}"}
    ran = farm(env, "pool", "exec", "--url", seeded, "--", "sh", "-c",
               'command -v adb; echo "$PATH"')
    assert ran.returncode == 0, ran.stderr
    found, path = ran.stdout.splitlines()
    assert Path(found).resolve() == Path(adbutils.adb_path()).resolve()
    assert path.split(os.pathsep)[0] == str(Path(adbutils.adb_path()).parent)
    assert str(decoy) in path.split(os.pathsep)  # the rest of PATH is kept, after it
    # The command name itself is looked up on that PATH too.
    version = farm(env, "pool", "exec", "--url", seeded, "--", "adb", "version")
    assert version.returncode == 0 and "Android Debug Bridge" in version.stdout, version.stderr
