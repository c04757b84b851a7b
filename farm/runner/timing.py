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
- heat: the HTP zone warms towards ``idle + rise`` while busy and cools to idle for ``idle_gap_s``
  before each run (Newton, in closed form); above ``throttle_c`` a step runs ``throttle_factor``
  slower, and the run is marked throttled;
- slowdown knobs for tests: a factor for runs with a given runner flag value, or of a given model file.

Nothing here sleeps: the runner's stats are read from a simulated clock (``SimClock``) that advances
by the model's step costs, so a simulated run takes the host's time and reports the phone's.

Reproducible: a run's draws come from the device's ``seed`` (in its spec; by default derived from its
serial) and the run's index on the device (counted in the device's state beside its heat), never from
lease order, ports, pids or the host's clock. Heat follows the phone's own time only (its busy time
and the modelled idle gap before each run), so how fast the host ran changes no figure: the Nth run of
a device with a given serial and seed reports the same figures every time. The price: waiting on the
host does not cool a simulated phone; its time passes only in its runs.
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
from dataclasses import asdict, dataclass
from pathlib import Path

from farm.errors import UsageError

TIMING_ENV = "PTEFARM_PHONE_TIMING"  # set by a virtual device: path of its timing spec (JSON)
DATA_FILE = Path(__file__).with_name("data") / "phone_timing.toml"


# The model's parameters have one home, the data file's [noise] and [heat] tables (what each means and
# where it comes from is said there): these classes hold them without defaults of their own.
@dataclass(frozen=True)
class Noise:
    sigma: float
    tail_p: float
    tail_mean: float
    unit_sigma: float
    day_sigma: float


@dataclass(frozen=True)
class Heat:
    idle_c: float
    rise_c: float
    heat_tau_s: float
    cool_tau_s: float
    throttle_c: float
    throttle_factor: float
    battery_idle_c: float
    battery_share: float
    idle_gap_s: float

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
    """``seed``: the device's noise (with each run's index on the device, the run's draws)."""

    soc: SocTiming
    noise: Noise
    heat: Heat
    seed: int = 0
    unit_factor: float = 1.0
    slowdowns: tuple[Slowdown, ...] = ()

    def to_json(self) -> dict:
        raw = asdict(self)
        raw["soc"]["decode"] = {u: [list(a) for a in anchors] for u, anchors in self.soc.decode.items()}
        return raw

    @classmethod
    def from_json(cls, raw: dict, where: str) -> PhoneTiming:
        try:
            noise, heat = _model(raw)
            return cls(soc=_soc_timing(raw["soc"]["soc"], raw["soc"]), noise=noise, heat=heat,
                       seed=int(raw["seed"]), unit_factor=float(raw.get("unit_factor", 1.0)),
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


def _soc_timing(name: str, table: dict) -> SocTiming:
    return SocTiming(soc=name, source=str(table["source"]), prefill_tok_s=float(table["prefill_tok_s"]),
                     decode=_anchors(table["decode"], name))


def _model(raw: dict) -> tuple[Noise, Heat]:
    """The noise and heat parameters of a data file or a spec (every one of them required)."""
    return Noise(**raw["noise"]), Heat(**raw["heat"])


def load_profiles(path: Path = DATA_FILE) -> tuple[dict[str, SocTiming], Noise, Heat]:
    """The data file's SoC figures, noise and heat parameters."""
    try:
        raw = tomllib.loads(path.read_text())
        socs = {name: _soc_timing(name, t) for name, t in raw.get("soc", {}).items()}
        return socs, *_model(raw)
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as e:
        raise UsageError(f"{path}: {type(e).__name__}: {e}") from None


def _key(*parts: object) -> int:
    """A 64-bit number fixed by ``parts`` (the same in every process: no hash randomization)."""
    text = "/".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def unit_factor(serial: str, sigma: float) -> float:
    """A unit's own speed factor (>1: slower), fixed by its serial."""
    return math.exp(random.Random(_key(serial)).gauss(0.0, sigma))


def default_seed(serial: str) -> int:
    """A device's noise seed unless its spec gives one: fixed by its serial, apart from its unit factor."""
    return _key("noise", serial)


def run_random(seed: int, index: int) -> random.Random:
    """The draws of a device's ``index``-th run (0 first): fixed by the device's seed and that index."""
    return random.Random(_key(seed, index))


def phone_timing(soc: str, serial: str, *, slowdowns: tuple[Slowdown, ...] = (), heat: Heat | None = None,
                 seed: int | None = None, path: Path = DATA_FILE) -> PhoneTiming:
    """The timing of a simulated phone of ``soc`` with this serial; ``seed``: its noise's, instead of
    the one its serial gives."""
    socs, noise, default_heat = load_profiles(path)
    if soc not in socs:
        raise UsageError(f"no simulated phone timing for {soc} in {path} (has {', '.join(sorted(socs))})")
    return PhoneTiming(soc=socs[soc], noise=noise, heat=heat or default_heat,
                       seed=default_seed(serial) if seed is None else seed,
                       unit_factor=unit_factor(serial, noise.unit_sigma), slowdowns=slowdowns)


def run_factor(noise: Noise, rng: random.Random) -> float:
    """One run's noise: log-normal, and now and then a background task's heavy tail."""
    factor = math.exp(rng.gauss(0.0, noise.sigma))
    if rng.random() < noise.tail_p:
        factor *= 1.0 + rng.expovariate(1.0 / noise.tail_mean)
    return factor


@dataclass
class PhoneState:
    """What a device keeps between runs: its HTP zone's temperature as its last run left it, and how
    many runs it has begun (the next run's index). The phone's own time, never the host's."""

    temp_c: float
    runs: int = 0


class HeatFile:
    """The device's state (a JSON file in its /data/system), read and written under a lock: two runs
    at once on one phone share its heat, and each takes its own index."""

    def __init__(self, path: str | Path, heat: Heat):
        self.path = Path(path)
        self.heat = heat

    def read(self) -> float:
        """The zone's temperature, as the last run left it (the phone's time stands between runs)."""
        return self._load().temp_c

    def _load(self) -> PhoneState:
        try:
            raw = json.loads(self.path.read_text())
            return PhoneState(float(raw["temp_c"]), int(raw.get("runs", 0)))
        except (OSError, ValueError, KeyError, TypeError):
            return PhoneState(self.heat.idle_c)

    @contextlib.contextmanager
    def _locked(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield self._load()

    def _save(self, state: PhoneState) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(asdict(state)))
        os.replace(tmp, self.path)

    def begin(self) -> tuple[float, int]:
        """A run starts: the phone idled its modelled gap since the last one. Returns the zone's
        temperature at the start and the run's index on the device."""
        with self._locked() as state:
            start_c = self.heat.cooled(state.temp_c, self.heat.idle_gap_s)
            self._save(PhoneState(start_c, state.runs + 1))
        return start_c, state.runs

    def add_busy(self, start_c: float, end_c: float) -> None:
        """Record a run that took the zone from ``start_c`` to ``end_c``; a run that overlapped
        adds its own rise."""
        with self._locked() as state:
            top = self.heat.idle_c + self.heat.rise_c
            self._save(PhoneState(min(state.temp_c + (end_c - start_c), top), state.runs))


class SimClock:
    """The runner's clock on a simulated phone: starts at the wall clock and advances only by the
    model's step costs, drawn from ``rng``. ``throttled``: some step of this run ran throttled."""

    def __init__(self, timing: PhoneTiming, *, updater: str, context: int, start_c: float,
                 rng: random.Random, slowdown: float = 1.0, start_ms: int | None = None):
        self.timing = timing
        self.updater = updater
        self.context = context
        self.temp_c = self.start_c = start_c
        self.factor = timing.unit_factor * slowdown * run_factor(timing.noise, rng)
        self._start_ms = WallClock.now_ms() if start_ms is None else start_ms
        self.busy_s = 0.0  # the run's time since its start: the stats' intervals, whatever the start
        self.throttled = False

    def now_ms(self) -> int:
        return self._start_ms + int(self.busy_s * 1000)

    def _spend(self, ms: float) -> None:
        heat = self.timing.heat
        if self.temp_c >= heat.throttle_c:
            ms *= heat.throttle_factor
            self.throttled = True
        ms *= self.factor
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
    heat after its idle gap, with the draws of the call's index on the device, and the heat the call
    made is kept for the next."""
    path = os.environ.get(TIMING_ENV)
    if not path:
        yield
        return
    timing, heat_path = load_timing_spec(path)
    heat_file = HeatFile(heat_path, timing.heat)
    flags = {k: str(v) for k, v in vars(args).items()}
    model_sha = file_sha256(args.model_path) if any(s.model_sha256 for s in timing.slowdowns) else None
    start_c, index = heat_file.begin()
    clock = SimClock(timing, updater=args.kv_updater, context=runner.context_len, start_c=start_c,
                     rng=run_random(timing.seed, index), slowdown=timing.slowdown(flags, model_sha))
    runner.clock = clock
    try:
        yield
    finally:
        runner.clock = WallClock()
        heat_file.add_busy(start_c, clock.temp_c)
