"""`farm chaos`: break the farm on purpose and check that it tells the truth.

Each scenario starts its own lab (virtual devices on an adb server of their own, a pool, the reference
bundle), runs real pytest runs of the ptefarm plugin in subprocesses, injects one fault for real
(a device process killed, an adb transport dropped, a full disk, a hung or crashing runner, a corrupted
.pte, the adb server killed, a lease holder killed or stopped, the pool database cut off, SIGINT, bad
input) and then checks what a CI engineer would: the outcome of every test (error, never a false pass
or a false failure), the report (every finished test present, attempts kept), the pool's event log
and device states, and the files. ``results lost`` counts tests that finished but are missing from
what the run left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from farm.bundle.manifest import describe_file
from farm.pool import Pool
from farm.results.records import ResultLog, journal_paths
from farm.selftest.bundles import stand_in_bundle
from farm.selftest.postgres import DEFAULT_PG_URL, PG_ENV, with_search_path
from farm.selftest.proxy import CuttableProxy
from farm.selftest.pytest_files import GENERATE_TEST, farm_toml
from farm.vocab import DeviceState, EventKind

PYTEST_TIMEOUT_S = 300


@dataclass
class Observation:
    observed: str = ""
    checks: list[tuple[str, bool]] = field(default_factory=list)
    expected_results: int = 0
    kept_results: int = 0

    def check(self, what: str, ok: bool) -> bool:
        self.checks.append((what, bool(ok)))
        return bool(ok)

    @property
    def survived(self) -> bool:
        return bool(self.checks) and all(ok for _, ok in self.checks)

    @property
    def lost(self) -> int:
        return max(0, self.expected_results - self.kept_results)

    def failed_checks(self) -> list[str]:
        return [what for what, ok in self.checks if not ok]


@dataclass(frozen=True)
class Scenario:
    name: str
    fault: str
    injected: str
    expected: str
    run: Callable[[Lab], Observation]


# Every scenario, in the order `farm chaos` lists and runs them: the order they are defined in below,
# each declared by ``@scenario`` beside its code.
SCENARIOS: list[Scenario] = []


def scenario(name: str, fault: str, injected: str, expected: str) -> Callable[[Callable], Callable]:
    """Declare the function below as scenario ``name`` of SCENARIOS: the fault, how it is injected
    and what the farm is expected to do (the columns of `farm chaos`'s table)."""
    def register(run: Callable[[Lab], Observation]) -> Callable[[Lab], Observation]:
        SCENARIOS.append(Scenario(name, fault, injected, expected, run))
        return run
    return register


def fault_of(judge: Callable[[Lab, Callable[..., str]], Observation], name: str, fault: str, injected: str,
             expected: str) -> Callable[[Callable[..., str]], Callable[..., str]]:
    """Declare the function below as what scenario ``name`` breaks (it breaks it and says how), and
    ``judge(lab, that function)`` as its run: scenarios that expect the same of the farm share one
    judge, and each says only its fault."""
    def register(inject: Callable[..., str]) -> Callable[..., str]:
        scenario(name, fault, injected, expected)(lambda lab: judge(lab, inject))
        return inject
    return register


# -- the lab --------------------------------------------------------------------------------------

class Lab:
    """One scenario's sandbox: everything lives under ``workdir`` and is stopped on exit."""

    def __init__(self, workdir: Path, manifest: Path):
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.manifest = Path(manifest)
        self.pool_url = f"sqlite:///{self.dir / 'pool.db'}"
        self.out = self.dir / "out"
        self.vf = None
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    # set-up
    def devices(self, *socs: str, lease_ttl_s: float = 300) -> list:
        from farm.virtual import VirtualDeviceSpec, VirtualFarm

        self.vf = self._stack.enter_context(VirtualFarm(home=self.dir / "farm"))
        records = self.vf.up([VirtualDeviceSpec(soc=s) for s in socs])
        self.config = farm_toml(self.dir / "farm.toml", self.vf.adb_server.port, self.pool_url,
                                lease_ttl_s=lease_ttl_s)
        from farm.device.discovery import discover

        with Pool.open(self.pool_url) as pool:
            pool.sync(discover([self.vf.adb_server]), [self.vf.adb_server])
        return records

    def test_file(self, prompts: list[str], text: str | None = None) -> Path:
        path = self.dir / "test_chaos_lab.py"
        path.write_text(text if text is not None else GENERATE_TEST.format(prompts=prompts, seq_len=48))
        return path

    def pytest_argv(self, *args: str, manifest: Path | None = None) -> list[str]:
        return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--rootdir",
                str(self.dir), "--farm-config", str(self.config), "--farm-bundle",
                str(manifest or self.manifest), "--farm-out", str(self.out),
                "--farm-retry-delay", "0.2", *args]

    def pytest(self, *args: str, manifest: Path | None = None,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(self.pytest_argv(*args, manifest=manifest), cwd=self.dir,
                              env={**os.environ, **(env or {})}, capture_output=True, text=True,
                              timeout=PYTEST_TIMEOUT_S)

    def popen(self, *args: str, manifest: Path | None = None) -> subprocess.Popen:
        return subprocess.Popen(self.pytest_argv(*args, manifest=manifest), cwd=self.dir,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    # reading what was left
    def records(self) -> list[dict]:
        """The report's records, or, if no report was written (killed run), the result log's."""
        try:
            return json.loads((self.out / "results.json").read_text())["results"]
        except (OSError, ValueError, KeyError):
            return [r.to_json() for r in ResultLog.read(journal_paths(self.out)[0])]

    def meta(self) -> dict:
        try:
            return json.loads((self.out / "results.json").read_text())["meta"]
        except (OSError, ValueError, KeyError):
            return {}

    def outcomes(self) -> dict[str, str]:
        return {r["nodeid"].rpartition("::")[2]: r["outcome"] for r in self.records()}

    def events(self) -> list:
        with Pool.open(self.pool_url) as pool:
            return pool.history(limit=None)

    def states(self) -> dict[str, str]:
        with Pool.open(self.pool_url) as pool:
            return {d.device.serial: d.device.state for d in pool.status().devices}

    def held(self) -> list[str]:
        with Pool.open(self.pool_url) as pool:
            return [d.device.serial for d in pool.status().devices if d.lease is not None]

    def touch(self, serial: str) -> None:
        """Lease and release ``serial`` once, so that the pool hands out the other devices first."""
        from farm.pool import Holder, LeaseRequest

        with Pool.open(self.pool_url) as pool:
            pool.release(pool.acquire(LeaseRequest(serial=serial), Holder.current("chaos"),
                                      timeout_s=10).token)

    def when_path_appears(self, root: Path, pattern: str, action: Callable[[], None],
                          timeout: float = 120) -> threading.Thread:
        """Run ``action`` once a file matching ``pattern`` appears under ``root`` (e.g. a deploy's
        partial file, a run's output directory): a fault injected at that exact moment."""
        def watch() -> None:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if next(iter(root.rglob(pattern)), None) is not None:
                    action()
                    return
                time.sleep(0.005)

        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        return thread


def _suites_dir() -> Path:
    """Where the farm's suites are installed (found, not imported: the library does not import them)."""
    import importlib.util

    spec = importlib.util.find_spec("ptefarm_suites")
    assert spec is not None and spec.submodule_search_locations, "ptefarm_suites is not installed"
    return Path(list(spec.submodule_search_locations)[0])


def _tail(proc: subprocess.CompletedProcess | str) -> str:
    text = proc if isinstance(proc, str) else proc.stdout + proc.stderr
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:160] if lines else ""


def _kept(obs: Observation, lab: Lab, expected: list[str]) -> dict[str, str]:
    outcomes = lab.outcomes()
    obs.expected_results = len(expected)
    obs.kept_results = sum(1 for name in expected if name in outcomes)
    return outcomes


# -- scenarios --------------------------------------------------------------------------------------

def _retry_elsewhere(lab: Lab, inject: Callable[[Lab, list], str], *, victim_offline: bool = True,
                     args: tuple[str, ...] = ()) -> Observation:
    """Two SM8650s, one test; ``inject(lab, devices)`` breaks the first device the test gets and returns
    a description. Expected: an infrastructure error, a re-run on the other device that passes."""
    obs = Observation()
    devices = lab.devices("SM8650", "SM8650")
    lab.test_file(["Once upon a time"])
    described = inject(lab, devices)
    proc = lab.pytest(*args)
    outcomes = _kept(obs, lab, ["test_generate[SM8650-Once upon a time]"])
    [record] = lab.records() or [{}]
    attempts = record.get("attempts", [])
    obs.check("the test passed on a re-run", outcomes.get("test_generate[SM8650-Once upon a time]")
              == "passed" and proc.returncode == 0)
    obs.check("the spoiled attempt is in the report", len(attempts) == 1)
    victim = attempts[0]["serial"] if attempts else None
    obs.check("the re-run went to another device", victim and record.get("serial") != victim)
    states = lab.states()
    if victim_offline:
        obs.check("the broken device is offline or quarantined",
                  states.get(victim) in (DeviceState.OFFLINE, DeviceState.QUARANTINED))
    else:
        obs.check("the device is not quarantined", DeviceState.QUARANTINED not in states.values())
    obs.check("no lease left behind", not lab.held())
    reason = attempts[0]["reason"] if attempts else _tail(proc)
    obs.observed = f"{described}: {'re-run passed on another device' if obs.survived else _tail(proc)}" \
                   f"; attempt 1: {reason[:90]}"
    return obs


def _on_first(lab: Lab, devices: list, pattern: str, action: Callable) -> None:
    """``action(device)`` once, on the first device where a file matching ``pattern`` appears."""
    fired = threading.Lock()

    def once(device) -> None:
        if fired.acquire(blocking=False):
            action(device)
    for d in devices:
        lab.when_path_appears(d.root / "data", pattern, lambda d=d: once(d))


@fault_of(_retry_elsewhere, "killed-during-deploy", "device killed during deploy",
          "SIGKILL of the device process when a push starts",
          "infra error, re-run on another device, device offline")
def killed_during_deploy(lab: Lab, devices: list) -> str:
    for d in devices:  # slow enough that the kill lands inside the push
        lab.vf.set_faults(d.serial, slow_bytes_per_s=400_000)
    _on_first(lab, devices, "*.ptefarm-partial*", lambda d: lab.vf.kill(d.serial))
    return "device process SIGKILLed while a .pte was being pushed"


@fault_of(_retry_elsewhere, "killed-during-run", "device killed during a run",
          "SIGKILL of the device process when the runner starts",
          "infra error, re-run on another device, device offline")
def killed_during_run(lab: Lab, devices: list) -> str:
    _on_first(lab, devices, "runner.pid", lambda d: lab.vf.kill(d.serial))
    return "device process SIGKILLed once the runner started"


@fault_of(_retry_elsewhere, "unplugged", "device unplugged", "`adb disconnect` when the runner starts",
          "infra error, re-run on another device, device offline")
def unplugged_during_run(lab: Lab, devices: list) -> str:
    _on_first(lab, devices, "runner.pid", lambda d: lab.vf.server.disconnect(d.serial))
    return "`adb disconnect` of the device once the runner started"


@scenario("slow-link", "link slowed", "every stream throttled to 300 kB/s", "completes; not quarantined")
def link_slowed(lab: Lab) -> Observation:
    obs = Observation()
    devices = lab.devices("SM8650")
    lab.vf.set_faults(devices[0].serial, slow_bytes_per_s=300_000)
    lab.test_file(["Once upon a time"])
    proc = lab.pytest()
    outcomes = _kept(obs, lab, ["test_generate[SM8650-Once upon a time]"])
    obs.check("completes and passes", proc.returncode == 0 and set(outcomes.values()) == {"passed"})
    obs.check("not quarantined for slowness", lab.states()[devices[0].serial] == DeviceState.AVAILABLE)
    obs.observed = f"every stream at 300 kB/s: {', '.join(sorted(set(outcomes.values())))}, device " \
                   f"{lab.states()[devices[0].serial]}"
    return obs


@scenario("storage-full", "storage full", "SEND fails past 50 kB on both devices",
          "infra error naming device and bytes; nothing half-deployed recorded")
def storage_full(lab: Lab) -> Observation:
    def inject(devices):
        lab.vf.set_faults(devices[0].serial, disk_full_after_bytes=50_000)
        lab.vf.set_faults(devices[1].serial, disk_full_after_bytes=50_000)
        return "both devices' storage fills after 50 kB"
    obs = Observation()
    devices = lab.devices("SM8650", "SM8650")
    lab.test_file(["Once upon a time"])
    described = inject(devices)
    proc = lab.pytest("--farm-retries", "1")
    outcomes = _kept(obs, lab, ["test_generate[SM8650-Once upon a time]"])
    [record] = lab.records() or [{}]
    obs.check("an infrastructure error, not a failure",
              outcomes.get("test_generate[SM8650-Once upon a time]") == "error"
              and record.get("error_kind") == "infra")
    text = record.get("message", "") + " ".join(a["reason"] for a in record.get("attempts", []))
    obs.check("the error names the device and the bytes", "bytes" in text and "127.0.0.1:" in text)
    obs.check("the exit code says infrastructure (pytest 1, verdict infra-error)",
              lab.meta().get("verdict") == "infra-error")
    half = [p for d in devices for p in (d.root / "data").rglob(".ptefarm-deploy.json")]
    obs.check("nothing half-deployed is recorded as deployed", not half)
    obs.observed = f"{described}: {record.get('outcome')}: {record.get('message', _tail(proc))[:110]}"
    return obs


@scenario("runner-hangs", "runner hangs", "hang fault on the runner command, 5 s run timeout",
          "killed at the timeout, re-run elsewhere, device usable")
def runner_hangs(lab: Lab) -> Observation:
    def inject(lab: Lab, devices: list) -> str:
        hung, good = devices
        lab.vf.set_faults(hung.serial, hang_commands="farm-llama-runner")
        lab.touch(good.serial)  # the pool hands out the least recently used device: the hung one
        return "the runner never finishes (hang fault), --farm-run-timeout 15"
    # Long enough for the good device's run on a loaded 2-core host (5 s was not, beside a full run).
    obs = _retry_elsewhere(lab, inject, victim_offline=False, args=("--farm-run-timeout", "15"))
    # The hung device stays usable: its runner was killed.
    for d in lab.vf.devices:
        lab.vf.clear_faults(d.serial)
    from farm.device.discovery import find_device

    ok = all(find_device([lab.vf.adb_server], d.serial).shell("echo ok", timeout=10).out.strip() == "ok"
             for d in lab.vf.devices)
    obs.check("the device answers after the timeout", ok)
    leftovers = _runner_processes(lab)
    obs.check("no runner left running", not leftovers)
    return obs


def _runner_processes(lab: Lab, needle: str = "") -> list[int]:
    """Runner processes of this lab's devices (inside a device's view, or with their cwd in the lab
    for an unconfined device), whose argv contains ``needle``."""
    import psutil

    inside = {pid for d in lab.vf.devices for pid in lab.vf.processes(d.serial)}
    found = []
    for p in psutil.process_iter(["cmdline", "cwd"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            # A run forked from a device's runner zygote has the zygote's argv, its parent's.
            forked = "farm.runner.zygote" in cmd and not needle and \
                "farm.runner.zygote" in " ".join(p.parent().cmdline() if p.parent() else [])
            if ("farm-llama-runner" in cmd or "qnn_llama_runner" in cmd or forked) and needle in cmd and \
                    (p.pid in inside or str(lab.dir) in (p.info["cwd"] or "")):
                found.append(p.pid)
        except (psutil.Error, TypeError):
            continue
    return found


def _stand_in(lab: Lab, behaviour: str, expect_outcome: str, needle: str) -> Observation:
    obs = Observation()
    lab.devices("SM8650")
    manifest = stand_in_bundle(lab.dir / "bundle", behaviour)
    lab.test_file(["Once upon a time"])
    proc = lab.pytest("--farm-retries", "0", manifest=manifest)
    outcomes = _kept(obs, lab, ["test_generate[SM8650-Once upon a time]"])
    [record] = lab.records() or [{}]
    got = outcomes.get("test_generate[SM8650-Once upon a time]")
    obs.check(f"{expect_outcome}, never a pass", got == expect_outcome and proc.returncode != 0)
    text = record.get("message", "") + record.get("details", "")
    obs.check(f"the report says {needle!r}", needle in text)
    obs.observed = f"{got}: {record.get('message', _tail(proc))[:120]}"
    return obs


@scenario("runner-crashes", "runner crashes", "stand-in runner exits 139 with a QNN error",
          "failure with exit code and stderr tail")
def runner_crashes(lab: Lab) -> Observation:
    obs = _stand_in(lab, "crash", "failed", "exited 139")
    [record] = lab.records() or [{}]
    obs.check("the stderr tail is in the report", "Failed to create context" in
              record.get("message", "") + record.get("details", ""))
    return obs


@scenario("runner-no-output", "runner exits 0, no output", "stand-in runner writes nothing",
          "error naming what is missing")
def runner_no_output(lab: Lab) -> Observation:
    return _stand_in(lab, "no-output", "error", "exit")


@scenario("runner-garbage", "runner writes garbage", "stand-in runner writes bytes that are not its output",
          "error, never a pass")
def runner_garbage(lab: Lab) -> Observation:
    return _stand_in(lab, "garbage", "error", "garbage")


def _refused_before_lease(lab: Lab, damage: Callable[[Path], str]) -> Observation:
    obs = Observation()
    lab.devices("SM8650")
    copy = lab.dir / "bundle"
    shutil.copytree(lab.manifest.parent, copy)
    described = damage(copy)
    lab.test_file(["Once upon a time"])
    proc = lab.pytest(manifest=copy / "manifest.json")
    obs.check("refused as bad input (pytest usage error)", proc.returncode == 4)
    obs.check("the message names the file", "kv_llama_xnnpack.pte" in proc.stderr
              or "passwd" in proc.stderr)
    obs.check("no device was leased", not [e for e in lab.events() if e.kind == EventKind.LEASED])
    obs.observed = f"{described}: exit {proc.returncode}: {_tail(proc.stderr)[:120]}"
    return obs


@fault_of(_refused_before_lease, "corrupted-pte", "corrupted .pte, same size",
          "one byte flipped in a copy of the bundle", "refused before any lease, naming file and digests")
def corrupted_pte(copy: Path) -> str:
    pte = copy / "kv_llama_xnnpack.pte"
    data = bytearray(pte.read_bytes())
    data[len(data) // 2] ^= 0xFF
    pte.write_bytes(bytes(data))
    return "one byte of kv_llama_xnnpack.pte flipped (same size)"


@fault_of(_refused_before_lease, "truncated-pte", "truncated .pte", "the .pte cut to 1000 bytes",
          "refused before any lease, naming the file")
def truncated_pte(copy: Path) -> str:
    pte = copy / "kv_llama_xnnpack.pte"
    pte.write_bytes(pte.read_bytes()[:1000])
    return "kv_llama_xnnpack.pte truncated to 1000 bytes"


@fault_of(_refused_before_lease, "path-outside", "path outside the bundle", "a manifest entry ../../etc/passwd",
          "refused before any lease")
def path_outside_bundle(copy: Path) -> str:
    manifest = copy / "manifest.json"
    raw = json.loads(manifest.read_text())
    target = Path("/etc/passwd")
    raw["files"].append({"name": "extra.bin", "path": os.path.relpath(target, copy),
                         "size": target.stat().st_size,
                         "sha256": describe_file(copy, target, role="other").sha256,
                         "role": "other"})
    manifest.write_text(json.dumps(raw))
    return "a manifest entry ../../etc/passwd with matching size and sha256"


@scenario("adb-server-killed", "adb server killed mid-run",
          "SIGKILL of the farm's adb server when a runner starts",
          "server restarted or a clear server error; no device quarantined")
def adb_server_killed(lab: Lab) -> Observation:
    obs = Observation()
    devices = lab.devices("SM8650", "SM8650")
    lab.test_file(["one", "two", "three"])

    def kill_server(d):
        import psutil

        port = lab.vf.adb_server.port  # the adb process itself, whoever started or watches it
        for conn in psutil.net_connections("tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
                os.kill(conn.pid, signal.SIGKILL)
    _on_first(lab, devices, "runner.pid", kill_server)
    from farm.session import healing

    with healing(lab.vf):  # the lab owns the server, as `farm virtual up`'s host does
        proc = lab.pytest()
    names = [f"test_generate[SM8650-{p}]" for p in ("one", "two", "three")]
    outcomes = _kept(obs, lab, names)
    obs.check("no test failed (errors or passes only)", "failed" not in outcomes.values())
    obs.check("every test has a result", len(outcomes) == 3)
    obs.check("no device quarantined for the server's fault", DeviceState.QUARANTINED not in lab.states().values())
    verdict = lab.meta().get("verdict")
    obs.check("the verdict is pass or infra-error", verdict in ("pass", "infra-error"))
    errors = [r["message"] for r in lab.records() if r["outcome"] == "error"]
    obs.check("an error names the adb server", all("adb server" in m for m in errors))
    spoiled = [a["reason"] for r in lab.records() for a in r.get("attempts", [])] + errors
    obs.check("the cut-off command was blamed on the server", any("AdbServerDown" in a for a in spoiled))
    obs.observed = f"adb server SIGKILLed mid-run: verdict {verdict}, " + \
        ", ".join(f"{k.split('-')[-1].rstrip(']')} {v}" for k, v in sorted(outcomes.items()))
    _ = proc
    return obs


HOLD_AND_TOUCH = r"""
import os, shlex, sys, time
from farm.pool import Pool, LeaseRequest, Holder
from farm.device.discovery import find_device
from farm.config import AdbServerAddress
from farm.device.fence import FencedDevice
pool = Pool.open(sys.argv[1])
lease = pool.acquire(LeaseRequest(socs=("SM8650",)), Holder.current(purpose="chaos holder"),
                     ttl_s=float(sys.argv[3]), timeout_s=30)
lease.start_heartbeat()
device = FencedDevice(find_device([AdbServerAddress.parse(sys.argv[2])], lease.serial), lease)
device.claim()
print(lease.serial, flush=True)
i = 0
while True:
    device.shell(f"echo {i} >> {shlex.quote(device.workspace + '/holder.log')}", timeout=10)
    i += 1
    time.sleep(0.2)
"""


def _start_holder(lab: Lab, ttl_s: float) -> tuple[subprocess.Popen, str]:
    """A process that leases the lab's device and keeps acting on it; returns it with the serial it
    holds (once it holds it)."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD_AND_TOUCH, lab.pool_url,
                               str(lab.vf.adb_server), str(ttl_s)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    return holder, holder.stdout.readline().strip()


@scenario("holder-killed", "lease holder SIGKILLed", "SIGKILL of a process holding a 3 s lease",
          "device back after the TTL")
def holder_killed(lab: Lab) -> Observation:
    obs = Observation()
    lab.devices("SM8650", lease_ttl_s=3)
    holder, serial = _start_holder(lab, ttl_s=3)
    holder.kill()
    holder.wait()
    lab.test_file(["Once upon a time"])
    started = time.monotonic()
    proc = lab.pytest("--farm-lease-timeout", "30")
    waited = time.monotonic() - started
    outcomes = _kept(obs, lab, ["test_generate[SM8650-Once upon a time]"])
    obs.check("the device came back after the TTL and the test passed", proc.returncode == 0)
    expired = [e for e in lab.events() if e.kind == EventKind.EXPIRED and e.serial == serial]
    obs.check("the pool logged the dead holder's lease as expired", bool(expired))
    obs.observed = f"holder of {serial} SIGKILLed: lease expired, next run passed after {waited:.1f}s " \
                   f"({outcomes})"
    return obs


@scenario("holder-stopped", "lease holder stopped past its TTL", "SIGSTOP, another run leases, SIGCONT",
          "the stopped holder never acts again")
def holder_stopped(lab: Lab) -> Observation:
    obs = Observation()
    devices = lab.devices("SM8650", lease_ttl_s=2)
    log = devices[0].root / "data/local/tmp/ptefarm/holder.log"
    holder, _ = _start_holder(lab, ttl_s=2)
    time.sleep(0.5)
    holder.send_signal(signal.SIGSTOP)
    lines_at_stop = len(log.read_text().splitlines()) if log.exists() else 0
    lab.test_file(["Once upon a time"])
    proc = lab.pytest("--farm-lease-timeout", "30")  # gets the device once the TTL has run out
    holder.send_signal(signal.SIGCONT)
    try:
        _, err = holder.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        holder.kill()
        _, err = holder.communicate()
    lines_after = len(log.read_text().splitlines()) if log.exists() else 0
    outcomes = _kept(obs, lab, ["test_generate[SM8650-Once upon a time]"])
    obs.check("the holder was acting before it was stopped", lines_at_stop > 0)
    obs.check("the second run got the device and passed", proc.returncode == 0)
    obs.check("the stopped holder never acted again", lines_after == lines_at_stop)
    obs.check("the stopped holder stopped with an error", holder.returncode not in (0, None))
    obs.observed = f"holder SIGSTOPped past its 2 s TTL, then resumed: wrote {lines_after - lines_at_stop}" \
                   f" more lines, exit {holder.returncode} ({_tail(err)[:70]}); other run {outcomes}"
    return obs


@scenario("pool-down", "pool database down 20 s", "PostgreSQL cut off by a proxy for 20 s mid-run",
          "run continues or stops clearly; every result kept; no double lease")
def pool_database_down(lab: Lab) -> Observation:
    import psycopg

    obs = Observation()
    base = os.environ.get(PG_ENV, DEFAULT_PG_URL)
    try:
        admin = psycopg.connect(base, autocommit=True, connect_timeout=5)
    except psycopg.Error as e:
        obs.observed = f"skipped: no PostgreSQL at {base} ({str(e)[:60]})"
        obs.check("a PostgreSQL server to cut off", False)
        return obs
    schema = f"ptefarm_chaos_{secrets.token_hex(4)}"
    admin.execute(f'CREATE SCHEMA "{schema}"')
    proxy = CuttableProxy(("127.0.0.1", 5432))
    try:
        lab.pool_url = with_search_path(f"postgresql://postgres@127.0.0.1:{proxy.port}/test", schema)
        lab.devices("SM8650", "SM8650", lease_ttl_s=60)
        prompts = [f"p{i}" for i in range(6)]
        lab.test_file(prompts)
        run = lab.popen("-n", "2")
        time.sleep(8)
        proxy.cut()
        time.sleep(20)
        proxy.restore()
        output = run.communicate(timeout=PYTEST_TIMEOUT_S)[0]
        names = [f"test_generate[SM8650-{p}]" for p in prompts]
        outcomes = _kept(obs, lab, names)
        obs.check("the run ended (no hang)", run.returncode is not None)
        obs.check("every test has a result", len(outcomes) == len(names))
        obs.check("no test failed because of the pool", "failed" not in outcomes.values())
        holders: dict[str, str | None] = {}
        double = False
        for e in lab.events():
            if e.kind == EventKind.LEASED:
                double |= holders.get(e.serial) is not None
                holders[e.serial] = e.token
            elif e.kind in (EventKind.RELEASED, EventKind.EXPIRED):
                holders[e.serial] = None
        obs.check("no double lease in the pool's log", not double)
        obs.observed = f"pool cut off for 20 s mid-run: {sum(v == 'passed' for v in outcomes.values())}" \
                       f" passed, {sum(v == 'error' for v in outcomes.values())} errors of " \
                       f"{len(names)}; exit {run.returncode}; {_tail(output)[:60]}"
    finally:
        proxy.close()
        with contextlib.suppress(psycopg.Error):
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
        admin.close()
    return obs


@scenario("sigint", "SIGINT of a run", "SIGINT while a runner is working",
          "leases released, runners killed, partial report, distinct exit code")
def sigint(lab: Lab) -> Observation:
    obs = Observation()
    lab.devices("SM8650")
    manifest = stand_in_bundle(lab.dir / "bundle", "echo")  # its runner sleeps on the prompt HANG
    lab.test_file([], text="import pytest\n"
                           "@pytest.mark.parametrize('i', range(3))\n"
                           "def test_slow(llm, i):\n"
                           "    assert llm.generate('HANG' if i == 1 else 'Once', mode='kv', seq_len=48).text\n")
    run = lab.popen(manifest=manifest)
    deadline = time.monotonic() + 120
    while not _runner_processes(lab, "HANG") and time.monotonic() < deadline:  # test 1's runner sleeps
        time.sleep(0.05)
    obs.check("a runner was working when the signal came", bool(_runner_processes(lab, "HANG")))
    run.send_signal(signal.SIGINT)
    output = run.communicate(timeout=60)[0]
    outcomes = _kept(obs, lab, ["test_slow[SM8650-0]"])
    obs.check("exit code says interrupted (pytest 2)", run.returncode == 2)
    obs.check("the report is marked partial", lab.meta().get("partial") is True)
    obs.check("the finished test is in it", outcomes.get("test_slow[SM8650-0]") == "passed")
    obs.check("the lease was released (not left to its TTL)", not lab.held())
    time.sleep(0.5)
    obs.check("no runner left running", not _runner_processes(lab))
    obs.observed = f"SIGINT during test 2: exit {run.returncode}, partial report with {outcomes}, " \
                   f"leases held {lab.held()}; {_tail(output)[:50]}"
    return obs


@scenario("run-killed", "SIGKILL of a run", "SIGKILL of pytest while a runner is working",
          "finished results kept; `farm report recover` writes a partial report")
def run_killed(lab: Lab) -> Observation:
    """SIGKILL of the pytest process: no report can be written by it, but the journal has every
    finished test, and `farm report recover` turns it into a partial report."""
    obs = Observation()
    devices = lab.devices("SM8650", lease_ttl_s=3)
    lab.vf.set_faults(devices[0].serial, hang_commands="HANG")
    lab.test_file([], text="import pytest\n"
                           "@pytest.mark.parametrize('prompt', ['Once upon a time', 'Hi there', 'HANG'])\n"
                           "def test_generate(llm, prompt):\n"
                           "    assert llm.generate(prompt, mode='kv', seq_len=48).text\n")
    run = lab.popen()
    deadline = time.monotonic() + 120
    while len(ResultLog.read(journal_paths(lab.out)[0])) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)
    run.kill()
    run.communicate()
    obs.check("the killed run wrote no report itself", not (lab.out / "results.json").exists())
    proc = subprocess.run([sys.executable, "-m", "farm.cli.main", "report", "recover", str(lab.out)],
                          capture_output=True, text=True, timeout=60)
    obs.check("farm report recover wrote the report", proc.returncode == 0)
    outcomes = _kept(obs, lab, ["test_generate[SM8650-Once upon a time]", "test_generate[SM8650-Hi there]"])
    obs.check("both finished tests are in it, passed", set(outcomes.values()) == {"passed"})
    obs.check("the report is marked partial", lab.meta().get("partial") is True)
    obs.observed = f"SIGKILL during test 3: recovered report has {sorted(outcomes)} ({lab.meta().get('verdict')})"
    return obs


@scenario("bad-input", "malformed config, cases, thresholds; hostile prompt",
          "bad bytes, a bad case name, a NaN minimum; shell metacharacters in a prompt",
          "one clear line naming the file; nothing runs; the prompt byte-exact")
def bad_input(lab: Lab) -> Observation:
    """Malformed config, case file and thresholds, and a hostile prompt: one line each, nothing
    leased; the hostile prompt reaches the runner byte for byte."""
    obs = Observation()
    lab.devices("SM8650")
    lab.test_file(["Once upon a time"])
    suites = _suites_dir()
    bad = lab.dir / "bad"
    bad.mkdir()
    (bad / "config.toml").write_bytes(b"[pool]\nlease_ttl_s = \xff\n")
    (bad / "cases.toml").write_text('[[case]]\nname = "x y"\nprompt = "hi"\n')
    (bad / "thresholds.toml").write_text('[[min]]\nsoc = "*"\nmode = "kv"\nseq_len = 48\n'
                                         'updater = "SmartMask"\ntok_s = nan\n')
    runs = {
        "config": subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                  "--rootdir", str(lab.dir), str(lab.dir / "test_chaos_lab.py"),
                                  "--farm-config", str(bad / "config.toml")], cwd=lab.dir,
                                 capture_output=True, text=True, timeout=120),
        "cases": lab.pytest(str(suites / "test_correctness.py"), "--farm-cases", str(bad / "cases.toml")),
        "thresholds": lab.pytest(str(suites / "test_throughput.py"), "--farm-thresholds",
                                 str(bad / "thresholds.toml")),
    }
    for what, proc in runs.items():
        text = proc.stdout + proc.stderr
        obs.check(f"bad {what}: refused, naming the file", proc.returncode != 0 and
                  str(bad / f"{what}.toml") in text and "Traceback (most recent call last)" not in text)
    obs.check("nothing was leased for bad input", not [e for e in lab.events() if e.kind == EventKind.LEASED])
    canary = lab.dir / "pwned"
    hostile = f"x\"$(touch {canary})`touch {canary}`;'\\n\n<|eot_id|> ü"
    manifest = stand_in_bundle(lab.dir / "echo", "echo")
    lab.test_file([hostile])
    proc = lab.pytest(manifest=manifest)
    obs.check("a hostile prompt reaches the runner byte for byte and runs nothing",
              proc.returncode == 0 and not canary.exists())
    obs.observed = "; ".join(f"{k}: exit {p.returncode}" for k, p in runs.items()) + \
        f"; hostile prompt: exit {proc.returncode}"
    return obs


def _named(name: str) -> Scenario:
    for s in SCENARIOS:
        if s.name == name:
            return s
    raise KeyError(name)


def run_scenario(name: str, workdir: Path, manifest: Path) -> Observation:
    s = _named(name)
    with Lab(workdir, manifest) as lab:
        try:
            return s.run(lab)
        except Exception as e:  # a scenario that crashes did not survive: say why, keep going
            obs = Observation(observed=f"scenario crashed: {type(e).__name__}: {e}"[:200])
            obs.check("the scenario ran", False)
            return obs


@contextlib.contextmanager
def chaos_dir(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ptefarm-chaos-") as tmp:
        yield Path(tmp)
