"""A simulated phone's timing: what the host runner reports as its timing on a virtual device started
with ``--timing phone``, in place of the host CPU's.

Every figure it produces is SIMULATED. The device announces it (``ro.ptefarm.timing=simulated``), and
the farm marks each figure of such a device simulated in JUnit, the results store, reports and the v3
export; none of it is ever a measurement. Host-CPU timing stays the default.

The model (parameters and their sources: ``data/phone_timing.toml``):

- a run's decode cost per token follows the SoC's published figures for its KV updater at the static
  cache's length (``context``), interpolated in ms per token; prefill at the SoC's prefill rate;
- run-to-run noise: a log-normal factor on the whole run, and with probability ``tail_p`` a
  background task adding an exponential share of time (a heavy tail, as phones show);
- the unit's own speed (``unit_factor``: fixed per device, unit-to-unit spread of one SoC);
- heat: the HTP zone warms towards ``idle + rise`` while busy and cools to idle between runs (Newton,
  in closed form, from the wall time between runs); above ``throttle_c`` a step runs
  ``throttle_factor`` slower, and the run is marked throttled;
- slowdown knobs for tests: a factor for runs with a given runner flag value, or of a given model file.

Nothing here sleeps: the runner's stats are read from a simulated clock (``SimClock``) that advances
by the model's step costs, so a simulated run takes the host's time and reports the phone's.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import random
import time
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from farm.errors import UsageError

TIMING_ENV = "PTEFARM_PHONE_TIMING"  # set by a virtual device: path of its timing spec (JSON)
DATA_FILE = Path(__file__).with_name("data") / "phone_timing.toml"


@dataclass(frozen=True)
class Noise:
    sigma: float = 0.012
    tail_p: float = 0.04
    tail_mean: float = 0.08
    unit_sigma: float = 0.025
    day_sigma: float = 0.015


@dataclass(frozen=True)
class Heat:
    idle_c: float = 35.5
    rise_c: float = 30.0
    heat_tau_s: float = 120.0
    cool_tau_s: float = 45.0
    throttle_c: float = 58.0
    throttle_factor: float = 1.35
    battery_idle_c: float = 31.2
    battery_share: float = 0.3

    def cooled(self, temp_c: float, idle_s: float) -> float:
        return self.idle_c + (temp_c - self.idle_c) * math.exp(-max(idle_s, 0.0) / self.cool_tau_s)

    def heated(self, temp_c: float, busy_s: float) -> float:
        top = self.idle_c + self.rise_c
        return top - (top - temp_c) * math.exp(-max(busy_s, 0.0) / self.heat_tau_s)

    def battery_c(self, temp_c: float) -> float:
        return self.battery_idle_c + (temp_c - self.idle_c) * self.battery_share


@dataclass(frozen=True)
class SocTiming:
    soc: str
    source: str
    prefill_tok_s: float
    decode: dict[str, tuple[tuple[int, float], ...]]  # updater -> ((context, tok/s), ...), by context

    def decode_ms(self, updater: str, context: int) -> float:
        """Milliseconds per decode token at a cache of ``context``, interpolated between anchors."""
        try:
            anchors = self.decode[updater]
        except KeyError:
            raise UsageError(f"phone timing of {self.soc}: no figures for the {updater!r} updater "
                             f"(has {', '.join(sorted(self.decode))})") from None
        points = [(c, 1000.0 / rate) for c, rate in anchors]
        if context <= points[0][0]:
            return points[0][1]
        for (c0, ms0), (c1, ms1) in zip(points, points[1:]):
            if context <= c1:
                return ms0 + (ms1 - ms0) * (context - c0) / (c1 - c0)
        return points[-1][1]


@dataclass(frozen=True)
class Slowdown:
    """A test's knob: runs matching it take ``factor`` times as long. ``flag``/``value``: a runner
    flag's value (``kv_updater`` = ``SmartMask``); ``model_sha256``: the model file's digest."""

    factor: float
    flag: str | None = None
    value: str | None = None
    model_sha256: str | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.factor, (int, float)) and math.isfinite(self.factor) and self.factor > 0):
            raise UsageError(f"phone timing slowdown: factor must be a number > 0, got {self.factor!r}")
        if (self.flag is None) == (self.model_sha256 is None) or (self.flag is None) != (self.value is None):
            raise UsageError("phone timing slowdown: give either flag and value, or model_sha256")


@dataclass(frozen=True)
class PhoneTiming:
    soc: SocTiming
    noise: Noise = field(default_factory=Noise)
    heat: Heat = field(default_factory=Heat)
    unit_factor: float = 1.0
    slowdowns: tuple[Slowdown, ...] = ()

    def to_json(self) -> dict:
        raw = asdict(self)
        raw["soc"]["decode"] = {u: [list(a) for a in anchors] for u, anchors in self.soc.decode.items()}
        return raw

    @classmethod
    def from_json(cls, raw: dict, where: str) -> PhoneTiming:
        try:
            soc = raw["soc"]
            return cls(soc=SocTiming(soc=soc["soc"], source=soc["source"],
                                     prefill_tok_s=float(soc["prefill_tok_s"]),
                                     decode=_anchors(soc["decode"], soc["soc"])),
                       noise=Noise(**raw.get("noise", {})), heat=Heat(**raw.get("heat", {})),
                       unit_factor=float(raw.get("unit_factor", 1.0)),
                       slowdowns=tuple(Slowdown(**s) for s in raw.get("slowdowns", ())))
        except (KeyError, TypeError, ValueError) as e:
            raise UsageError(f"{where}: not a phone timing spec: {type(e).__name__}: {e}") from None

    def slowdown(self, flags: dict[str, str], model_sha256: str | None) -> float:
        factor = 1.0
        for s in self.slowdowns:
            if (s.flag is not None and flags.get(s.flag) == s.value) or \
                    (s.model_sha256 is not None and s.model_sha256 == model_sha256):
                factor *= s.factor
        return factor


def _anchors(raw: dict, soc: str) -> dict[str, tuple[tuple[int, float], ...]]:
    decode = {}
    for updater, anchors in raw.items():
        points = tuple(sorted((int(c), float(r)) for c, r in anchors))
        if not points or any(c <= 0 or not (math.isfinite(r) and r > 0) for c, r in points) \
                or len({c for c, _ in points}) != len(points):
            raise UsageError(f"phone timing of {soc}: {updater}: anchors must be distinct "
                             f"[context > 0, tok/s > 0] pairs, got {anchors!r}")
        decode[updater] = points
    return decode


def load_profiles(path: Path = DATA_FILE) -> tuple[dict[str, SocTiming], Noise, Heat]:
    """The data file's SoC figures, noise and heat parameters."""
    try:
        raw = tomllib.loads(path.read_text())
        socs = {name: SocTiming(soc=name, source=str(t["source"]), prefill_tok_s=float(t["prefill_tok_s"]),
                                decode=_anchors(t["decode"], name))
                for name, t in raw.get("soc", {}).items()}
        return socs, Noise(**raw.get("noise", {})), Heat(**raw.get("heat", {}))
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as e:
        raise UsageError(f"{path}: {type(e).__name__}: {e}") from None


def unit_factor(serial: str, sigma: float) -> float:
    """A unit's own speed factor (>1: slower), fixed by its serial."""
    seed = int.from_bytes(hashlib.sha256(serial.encode()).digest()[:8], "big")
    return math.exp(random.Random(seed).gauss(0.0, sigma))


def phone_timing(soc: str, serial: str, *, slowdowns: tuple[Slowdown, ...] = (),
                 heat: Heat | None = None, path: Path = DATA_FILE) -> PhoneTiming:
    """The timing of a simulated phone of ``soc`` with this serial."""
    socs, noise, default_heat = load_profiles(path)
    if soc not in socs:
        raise UsageError(f"no simulated phone timing for {soc} in {path} (has {', '.join(sorted(socs))})")
    return PhoneTiming(soc=socs[soc], noise=noise, heat=heat or default_heat,
                       unit_factor=unit_factor(serial, noise.unit_sigma), slowdowns=slowdowns)


def run_factor(noise: Noise, rng: random.Random) -> float:
    """One run's noise: log-normal, and now and then a background task's heavy tail."""
    factor = math.exp(rng.gauss(0.0, noise.sigma))
    if rng.random() < noise.tail_p:
        factor *= 1.0 + rng.expovariate(1.0 / noise.tail_mean)
    return factor


@dataclass
class HeatState:
    """The HTP zone's temperature at a wall time, kept between runs on the device."""

    temp_c: float
    wall: float

    def now(self, heat: Heat, wall: float) -> float:
        return heat.cooled(self.temp_c, wall - self.wall)


class HeatFile:
    """The device's heat state (a JSON file in its /data/system), read and written under a lock:
    two runs at once on one phone share its heat."""

    def __init__(self, path: str | Path, heat: Heat):
        self.path = Path(path)
        self.heat = heat

    def read(self, wall: float | None = None) -> float:
        """The zone's temperature now."""
        wall = time.time() if wall is None else wall
        return self._load().now(self.heat, wall)

    def _load(self) -> HeatState:
        try:
            raw = json.loads(self.path.read_text())
            return HeatState(float(raw["temp_c"]), float(raw["wall"]))
        except (OSError, ValueError, KeyError, TypeError):
            return HeatState(self.heat.idle_c, 0.0)

    def add_busy(self, start_c: float, end_c: float, wall: float) -> None:
        """Record a run that took the zone from ``start_c`` to ``end_c``; a run that overlapped
        adds its own rise."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            now = self._load().now(self.heat, wall)
            state = HeatState(min(now + (end_c - start_c), self.heat.idle_c + self.heat.rise_c), wall)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            tmp.write_text(json.dumps(asdict(state)))
            os.replace(tmp, self.path)


class SimClock:
    """The runner's clock on a simulated phone: starts at the wall clock and advances only by the
    model's step costs. ``throttled``: some step of this run ran throttled."""

    def __init__(self, timing: PhoneTiming, *, updater: str, context: int, start_c: float,
                 slowdown: float = 1.0, rng: random.Random | None = None, start_ms: int | None = None):
        self.timing = timing
        self.updater = updater
        self.context = context
        self.temp_c = self.start_c = start_c
        rng = rng or random.Random()
        self.factor = timing.unit_factor * slowdown * run_factor(timing.noise, rng)
        self._ms = float(int(time.time() * 1000) if start_ms is None else start_ms)
        self.busy_s = 0.0
        self.throttled = False

    def now_ms(self) -> int:
        return int(self._ms)

    def _spend(self, ms: float) -> None:
        heat = self.timing.heat
        if self.temp_c >= heat.throttle_c:
            ms *= heat.throttle_factor
            self.throttled = True
        ms *= self.factor
        self._ms += ms
        self.busy_s += ms / 1000
        self.temp_c = heat.heated(self.temp_c, ms / 1000)

    def prefill(self, tokens: int) -> None:
        self._spend(tokens * 1000.0 / self.timing.soc.prefill_tok_s)

    def decode(self, steps: int = 1) -> None:
        for _ in range(steps):
            self._spend(self.timing.soc.decode_ms(self.updater, self.context))


class WallClock:
    """The host's clock: what a runner reports by default."""

    throttled = False

    @staticmethod
    def now_ms() -> int:
        return int(time.time() * 1000)

    def prefill(self, tokens: int) -> None:
        pass

    def decode(self, steps: int = 1) -> None:
        pass


def simulate_tok_s(timing: PhoneTiming, *, updater: str, context: int, prompt_tokens: int,
                   generated: int, rng: random.Random, start_c: float | None = None,
                   slowdown: float = 1.0) -> tuple[float, SimClock]:
    """One simulated run's inference_speed (generated / (end - start), prefill included, as
    qnn_llama_runner writes it), without a runner: for benches of the gate's statistics."""
    clock = SimClock(timing, updater=updater, context=context, slowdown=slowdown, rng=rng, start_ms=0,
                     start_c=timing.heat.idle_c if start_c is None else start_c)
    clock.prefill(prompt_tokens)
    clock.decode(generated)
    return generated / clock.now_ms() * 1000, clock


def load_timing_spec(path: str) -> tuple[PhoneTiming, str]:
    """A device's timing spec: the model, and where its heat state lives."""
    try:
        raw = json.loads(Path(path).read_text())
        heat_path = str(raw["heat_path"])
    except (OSError, ValueError, KeyError) as e:
        raise UsageError(f"{TIMING_ENV}={path}: not a timing spec: {type(e).__name__}: {e}") from None
    return PhoneTiming.from_json(raw, path), heat_path


def file_sha256(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None


@contextlib.contextmanager
def simulated_phone(runner, args):
    """One generate call of the runner on the simulated phone its device names (``TIMING_ENV``), or
    on the host's clock when none is named: the call's stats come from a ``SimClock`` at the phone's
    current heat, and the heat the call made is kept for the next."""
    path = os.environ.get(TIMING_ENV)
    if not path:
        yield
        return
    timing, heat_path = load_timing_spec(path)
    heat_file = HeatFile(heat_path, timing.heat)
    start_c = heat_file.read()
    flags = {k: str(v) for k, v in vars(args).items()}
    model_sha = file_sha256(args.model_path) if any(s.model_sha256 for s in timing.slowdowns) else None
    clock = SimClock(timing, updater=args.kv_updater, context=runner.context_len, start_c=start_c,
                     slowdown=timing.slowdown(flags, model_sha))
    runner.clock = clock
    try:
        yield
    finally:
        runner.clock = WallClock()
        heat_file.add_busy(start_c, clock.temp_c, time.time())
