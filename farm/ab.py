"""``farm ab``: two variants measured on the same devices in interleaved, randomized blocks, until the
interval decides or the budget is spent (the statistics: farm/results/ab.py).

A variant is a bundle and a run request (updater, mode, seq_len, prompt): two bundles with the same
request, or one bundle with two requests (the two updaters). Each device of the SoC is leased for the
whole comparison; both bundles are deployed side by side (each has its own workspace, so they stay
cached), then every round runs ``look_every`` blocks on every device at once, one thread per device.
A block is one run of each variant in a random order (a coin per block, from ``seed`` and the
device's own serial, ro.serialno). Each run keeps its conditions: the battery level and temperature
before and after, the thermal status after, and whether the device was throttling before or after it
(thermal status 2, MODERATE, or above, when it answered). A device measures in forced deep idle.
``sample_blocks`` is the sampling on devices already held and deployed: the suites' A/B tests use it
on their leased device.

A failure of the infrastructure (a device gone, adb, a lease lost) is raised as such: no verdict is
given on the blocks measured so far. A runner that fails is the variant's failure (``RunnerFailed``).
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field

from farm.bundle.manifest import Bundle
from farm.device.conditions import Conditions, forced_idle, pinned_governors, read_conditions
from farm.device.discovery import find_device
from farm.errors import UsageError
from farm.execute.chunking import ChunkPolicy
from farm.execute.deploy import deploy
from farm.execute.run import run
from farm.execute.runprofile import RunRequest
from farm.pool import Holder, LeaseRequest
from farm.pool.hold import hold
from farm.results.ab import ABConfig, ABResult, ABVerdict, Block, compare, looks
from farm.session import Farm
from farm.vocab import Timing


@dataclass(frozen=True)
class Variant:
    label: str
    bundle: Bundle
    request: RunRequest

    def describe(self) -> str:
        r = self.request
        extra = f" {' '.join(r.extra_args)}" if r.extra_args else ""
        return f"{self.label}: {self.bundle.name} {r.mode}/{r.updater} seq_len {r.seq_len}{extra}"


@dataclass(frozen=True)
class Sample:
    """One measured run and the conditions it ran in: the device's readings before and after it."""

    serial: str
    variant: str
    block: int
    tok_s: float
    before: Conditions
    after: Conditions

    @property
    def throttled(self) -> bool:
        """Whether the device was throttling before or after the run (where it answered)."""
        return self.before.throttling or self.after.throttling

    @property
    def conditions(self) -> dict:
        """The readings in full, as the results keep them."""
        return {"before": self.before.to_json(), "after": self.after.to_json(), "throttled": self.throttled}

    def to_json(self) -> dict:
        """The run as ``farm ab --json`` writes it: the readings read most (the battery level before,
        its temperature before and after, the thermal status after), then all of them."""
        return {"serial": self.serial, "variant": self.variant, "block": self.block, "tok_s": self.tok_s,
                "battery_level": self.before.battery_level, "temp_before_c": self.before.battery_temp_c,
                "temp_after_c": self.after.battery_temp_c, "thermal_status": self.after.thermal_status,
                "throttled": self.throttled, "conditions": self.conditions}


@dataclass
class ABRun:
    a: Variant
    b: Variant
    soc: str
    serials: list[str]
    timing: str                    # farm.vocab.Timing of the devices' figures (the least measured)
    config: ABConfig
    result: ABResult
    samples: list[Sample] = field(default_factory=list)
    device_s: float = 0.0          # wall seconds of runs, summed over devices
    stopped: str = ""              # why sampling stopped
    pinning: dict[str, str] = field(default_factory=dict)  # serial -> its CPU governors' pinning

    def to_json(self) -> dict:
        return {"a": self.a.describe(), "b": self.b.describe(), "soc": self.soc, "serials": self.serials,
                "timing": self.timing, "simulated": self.timing == Timing.SIMULATED,
                "config": asdict(self.config), "result": self.result.to_json(),
                "device_s": round(self.device_s, 3), "stopped": self.stopped, "governor_pinning": self.pinning,
                "samples": [s.to_json() for s in self.samples]}


def _measure(device, variant: Variant, block: int, timeout: float) -> tuple[Sample, float]:
    before = read_conditions(device)
    started = time.monotonic()
    result = run(device, variant.bundle, variant.request, timeout=timeout)
    spent = time.monotonic() - started
    if result.tokens_per_s is None or not (math.isfinite(result.tokens_per_s) and result.tokens_per_s > 0):
        raise UsageError(f"{device.serial}: variant {variant.label} wrote no usable inference_speed.txt "
                         f"({result.tokens_per_s!r})")
    after = read_conditions(device)
    return Sample(device.serial, variant.label, block, float(result.tokens_per_s), before, after), spent


@dataclass
class Sampling:
    """What ``sample_blocks`` measured: the verdict at its last look and everything it stands on."""

    result: ABResult
    blocks: list[Block]
    samples: list[Sample]          # the measured runs (warm-ups not included)
    device_s: float                # wall seconds of runs, summed over devices (warm-ups included)
    stopped: str                   # why sampling stopped
    pinning: dict[str, str] = field(default_factory=dict)  # serial -> its CPU governors' pinning


def _own_serial(device) -> str:
    """The device's ro.serialno (a phone's is its USB serial), or the adb server's name for it when
    it tells none."""
    own = device.shell("getprop ro.serialno", timeout=30).out.strip()
    return own or device.serial


def _decided(result: ABResult) -> bool:
    return result.verdict != ABVerdict.UNDECIDED


def sample_blocks(devices: list, a: Variant, b: Variant, config: ABConfig, *, budget_s: float | None = None,
                  seed: int | None = None, run_timeout_s: float = 600.0, warmup: int = 0,
                  decided: Callable[[ABResult], bool] = _decided,
                  on_look: Callable[[ABResult, int], None] | None = None) -> Sampling:
    """Blocks of both variants on ``devices`` (handles on which both are deployed), all devices at
    once, until ``decided`` says the result at a look decides, the design's last look, or
    ``budget_s`` device-seconds. ``warmup`` blocks run first on every device and are dropped. Each
    device is held in forced deep idle while it measures, its CPU governors pinned where it allows."""
    config.check_decidable(len(devices))
    # Each device's coins follow the seed and its own serial alone, never the order the devices were
    # leased in nor the adb server's name for it (a virtual device's is its port): with a seed, a
    # device's blocks run in the same order whichever devices it is with, wherever it listens.
    coins = {d.serial: random.Random() if seed is None else random.Random(f"{seed}/{_own_serial(d)}")
             for d in devices}
    blocks: list[Block] = []
    samples: list[Sample] = []
    spent = {d.serial: 0.0 for d in devices}
    lock = threading.Lock()

    pinning: dict[str, str] = {}

    def blocks_on(device, first: int, count: int, keep: bool = True) -> None:
        with forced_idle(device), pinned_governors(device) as pinned:
            pinning[device.serial] = pinned
            for i in range(first, first + count):
                a_first = coins[device.serial].random() < 0.5
                got = {}
                for v in (a, b) if a_first else (b, a):
                    one, seconds = _measure(device, v, i, run_timeout_s)
                    got[v.label] = one
                    with lock:
                        spent[device.serial] += seconds
                        if keep:
                            samples.append(one)
                if keep:
                    with lock:
                        blocks.append(Block(device.serial, got[a.label].tok_s, got[b.label].tok_s, a_first))

    done, result, stopped = 0, None, ""
    with ThreadPoolExecutor(max_workers=len(devices), thread_name_prefix="ab") as pool:
        def each(first: int, count: int, keep: bool = True) -> None:
            futures = [pool.submit(blocks_on, d, first, count, keep) for d in devices]
            for f in futures:
                f.result()  # an infrastructure error or a failed runner ends the comparison

        if warmup:
            each(-warmup, warmup, keep=False)
        for at in looks(config):
            each(done, at - done)
            done = at
            result = compare(blocks, config)
            if on_look is not None:
                on_look(result, done)
            if decided(result):
                stopped = f"decided after {done} block(s) per device"
                break
            if budget_s is not None and sum(spent.values()) >= budget_s:
                stopped = f"budget of {budget_s:g} device-seconds spent after {done} block(s) per device"
                break
        else:
            stopped = f"{config.max_blocks} block(s) per device, the most the design allows"
    assert result is not None  # looks() has at least one look
    return Sampling(result, blocks, samples, sum(spent.values()), stopped, pinning)


def run_ab(farm: Farm, a: Variant, b: Variant, *, soc: str, devices: int, config: ABConfig,
           budget_s: float | None = None, seed: int | None = None, run_timeout_s: float = 600.0,
           acquire_timeout_s: float = 600.0, ttl_s: float = 300.0,
           on_look: Callable[[ABResult, int], None] | None = None,
           chunking: ChunkPolicy | None = None) -> ABRun:
    """Lease ``devices`` devices of ``soc``, deploy both variants and compare them (see the module)."""
    if devices < 1:
        raise UsageError(f"--devices must be at least 1, got {devices}")
    for v in (a, b):
        v.request.check()
    config.check_decidable(devices)  # before any device is leased
    holder = Holder.current(purpose=f"farm ab {a.bundle.name} vs {b.bundle.name}")
    with ExitStack() as stack:
        handles = []
        timings = []
        for _ in range(devices):
            lease = farm.pool.acquire(LeaseRequest(socs=(soc,), exclude=tuple(h.serial for h in handles)),
                                      holder, ttl_s=ttl_s, timeout_s=acquire_timeout_s)
            held = stack.enter_context(hold(lease, release=lambda lease: farm.pool.release(lease.token),
                                            outlive="the comparison"))
            adb = find_device(farm.address.adb_servers, lease.serial, workspace_root=farm.address.workspace)
            handles.append(held.claim(adb))
            timings.append(Timing.of(adb.props(), lease.device.virtual))
        for device in handles:
            for bundle in {id(v.bundle): v.bundle for v in (a, b)}.values():
                deploy(device, bundle, timeout=min(run_timeout_s, 120.0), chunking=chunking)
        got = sample_blocks(handles, a, b, config, budget_s=budget_s, seed=seed, run_timeout_s=run_timeout_s,
                            on_look=on_look)
        least = min(timings, key=[Timing.SIMULATED, Timing.HOST_CPU, Timing.MEASURED].index)
        return ABRun(a, b, soc, [d.serial for d in handles], str(least), config, got.result, got.samples,
                     got.device_s, got.stopped, got.pinning)
