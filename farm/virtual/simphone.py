"""A virtual device that simulates a phone's timing (``farm virtual up --timing phone``).

Such a device announces ``ro.ptefarm.timing=simulated`` and gives its runner the timing spec of its
SoC and unit (farm/runner/timing.py) in ``R/system/etc/ptefarm-timing.json``: every figure its runner
writes is the model's, not the host's, and the farm marks it simulated. The spec is read at each run,
so a test's slowdown knob (``set_slowdowns``) or noise seed (``set_seed``; by default the serial's)
takes effect at the next run.

The heat its runs make, and how many runs it has begun (each run's draws follow its index), live in
the device's ``/data/system/ptefarm-heat.json`` (the runner writes it; ``reset_state`` removes it).
``HeatRenderer`` shows the heat where a phone shows it: the HTP and skin zones, the battery
temperature, and so ``dumpsys battery`` and ``dumpsys thermalservice`` (whose status follows the skin
zone, as a Snapdragon thermal HAL's does). On such a device the model owns those three readings.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import replace
from pathlib import Path

from farm.errors import UsageError
from farm.fileio import write_atomic
from farm.soc import soc_from_props
from farm.runner.timing import TIMING_ENV, Heat, HeatFile, PhoneTiming, Slowdown, phone_timing
from farm.virtual.phone import load_phone, save_phone

log = logging.getLogger(__name__)

TIMING_PROP = "ro.ptefarm.timing"
SIMULATED = "simulated"
TIMINGS = ("host", "phone")
SPEC_REL = "system/etc/ptefarm-timing.json"
HEAT_REL = "data/system/ptefarm-heat.json"
HTP_ZONE = "nsphvx-0"
SKIN_ZONE = "skin-therm"
SKIN_IDLE_C = 31.0
SKIN_SHARE = 0.45  # the skin's rise per degree of the HTP's: 58 deg C HTP -> ~41 deg C skin (LIGHT+)
RENDER_EVERY_S = 0.5


def is_simulated(props: dict[str, str]) -> bool:
    return props.get(TIMING_PROP) == SIMULATED


def check_timing(timing: str, soc: str) -> None:
    """Bad input before anything starts: an unknown timing, or a SoC the model has no figures for."""
    if timing not in TIMINGS:
        raise UsageError(f"virtual device timing must be one of {', '.join(TIMINGS)}, got {timing!r}")
    if timing == "phone":
        phone_timing(soc, "")


def install_timing(root: Path, props: dict[str, str], *, confined: bool,
                   slowdowns: tuple[Slowdown, ...] | None = None, seed: int | None = None) -> dict[str, str]:
    """Write the device's timing spec (at each start, and when a knob changes); returns what its
    commands' environment gains. A device with host timing gets nothing and has no spec. The knobs
    and the seed not given are kept from the spec there is."""
    spec_path = root / SPEC_REL
    if not is_simulated(props):
        spec_path.unlink(missing_ok=True)
        return {}
    if spec_path.exists():
        current = current_timing(root)
        slowdowns = current.slowdowns if slowdowns is None else slowdowns
        seed = current.seed if seed is None else seed
    timing = phone_timing(_soc(props), props["ro.serialno"], slowdowns=slowdowns or (), seed=seed)
    (root / HEAT_REL).parent.mkdir(parents=True, exist_ok=True)
    heat_path = f"/{HEAT_REL}" if confined else str(root / HEAT_REL)
    spec_path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(spec_path, json.dumps({**timing.to_json(), "heat_path": heat_path}, indent=1))
    return {TIMING_ENV: f"/{SPEC_REL}" if confined else str(spec_path)}


def _soc(props: dict[str, str]) -> str:
    soc = soc_from_props(props)
    if soc is None:
        raise UsageError(f"virtual device {props.get('ro.serialno')}: no SoC to simulate the timing of")
    return soc


def current_timing(root: Path) -> PhoneTiming:
    path = root / SPEC_REL
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: this virtual device simulates no phone timing ({e})") from None
    return PhoneTiming.from_json(raw, str(path))


def _check_simulated(props: dict[str, str], what: str) -> None:
    if not is_simulated(props):
        raise UsageError(f"virtual device {props.get('ro.serialno')} runs on host timing: {what} "
                         f"needs a device started with --timing phone")


def set_slowdowns(root: Path, props: dict[str, str], slowdowns: tuple[Slowdown, ...], *,
                  confined: bool) -> None:
    """The test knob: runs matching a slowdown take its factor times as long, from the next run."""
    _check_simulated(props, "a slowdown")
    install_timing(root, props, confined=confined, slowdowns=slowdowns)


def set_seed(root: Path, props: dict[str, str], seed: int, *, confined: bool) -> None:
    """The device's noise seed in place of its serial's, from the next run (its runs keep their index)."""
    _check_simulated(props, "a noise seed")
    install_timing(root, props, confined=confined, seed=seed)


def reset_state(root: Path) -> None:
    """A phone at rest with no run behind it: idle heat, and the next run is its run 0 again, with the
    draws it had then."""
    (root / HEAT_REL).unlink(missing_ok=True)


def apply_heat(root: Path, heat: Heat, htp_c: float) -> bool:
    """Show an HTP temperature in the device's phone state; False when nothing changed enough."""
    state = load_phone(root)
    skin = SKIN_IDLE_C + (htp_c - heat.idle_c) * SKIN_SHARE
    battery = heat.battery_c(htp_c)
    if abs(state.battery_temp_c - battery) < 0.05 and any(
            z.type == HTP_ZONE and abs(z.temp_c - htp_c) < 0.05 for z in state.thermal):
        return False
    new = replace(state.with_zone(HTP_ZONE, round(htp_c, 2)).with_zone(SKIN_ZONE, round(skin, 2)),
                  battery_temp_c=round(battery, 2))
    save_phone(root, new)
    return True


class HeatRenderer:
    """A thread of the device process: keeps the phone state showing the heat its runs made (and
    their cooling since) while the device runs."""

    def __init__(self, root: Path, heat: Heat):
        self.root = root
        self.heat_file = HeatFile(root / HEAT_REL, heat)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="heat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def render_once(self) -> bool:
        return apply_heat(self.root, self.heat_file.heat, self.heat_file.read())

    def _loop(self) -> None:
        while not self._stop.wait(RENDER_EVERY_S):
            try:
                self.render_once()
            except Exception as e:  # noqa: BLE001 - a reading left stale must not end the device
                log.warning("heat not rendered: %s", e)
