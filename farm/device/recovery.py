"""The recovery ladder: what the farm tries on a device that failed for infrastructure reasons before it
takes it out of service, as Tradefed's and Mobly's device recovery do.

A device is healthy when its adb server lists it as ``device``, a shell answers, and
``sys.boot_completed`` is 1. A device that is not is taken up the rungs ``[recovery] rungs`` names, in
this order, each only while it is still unhealthy:

- ``return``: wait for it to be listed again and a shell to answer (a phone whose USB link reset drops
  off the bus and comes back; one whose adbd restarted);
- ``boot``: wait for ``sys.boot_completed`` (a phone that rebooted by itself, or is still booting);
- ``reboot``: ``adb reboot`` (a service, not a shell command: it reaches a phone whose shell hangs),
  then wait for it to come back booted.

The verdict says what the caller may conclude: ``healthy`` (nothing was wrong with the device by the
time it was looked at), ``recovered`` (a rung brought it back), ``failed`` (it was there and no rung
brought it back: take it out of service), ``absent`` (never listed: unplugged or dead; it is offline,
not failing, and comes back when it returns) or ``server-down`` (its adb server does not answer: not the
device's fault, nothing is concluded about it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from farm.config import AdbServerAddress, RecoveryConfig
from farm.device.transport import DeviceTransport, client_for, list_server, short
from farm.errors import AdbServerDown, InfraError

POLL_S = 0.5            # between probes while a rung waits
ALIVE = "ptefarm-alive"

# A virtual device is back from a reboot in about two seconds, and one that a test killed never
# returns by itself: a phone's minutes of waiting would only slow its run down.
VIRTUAL_CAPS_S = {"return_timeout_s": 5.0, "boot_timeout_s": 10.0, "reboot_timeout_s": 30.0,
                  "probe_timeout_s": 3.0}

HEALTHY, RECOVERED, FAILED, ABSENT, SERVER_DOWN = "healthy", "recovered", "failed", "absent", "server-down"


def for_virtual(config: RecoveryConfig) -> RecoveryConfig:
    """The ladder for a virtual device: the config's rungs, its waits capped by ``VIRTUAL_CAPS_S``."""
    return replace(config, **{k: min(getattr(config, k), cap) for k, cap in VIRTUAL_CAPS_S.items()})


@dataclass(frozen=True)
class Health:
    """One look at a device: listed as ``device``, a shell answered, booted; and what was seen."""

    listed: bool
    answers: bool
    booted: bool
    detail: str
    server_down: bool = False

    @property
    def healthy(self) -> bool:
        return self.listed and self.answers and self.booted


def probe(server: AdbServerAddress, serial: str, *, timeout_s: float) -> Health:
    """Look at the device once: its adb state, then one shell command that echoes and reads
    ``sys.boot_completed``. Never raises for the device's or the server's trouble: that is the answer."""
    client = client_for(server)
    try:
        state = dict(list_server(client, server, serial=serial)).get(serial)
    except AdbServerDown as e:
        return Health(False, False, False, f"adb server down: {e}", server_down=True)
    except InfraError as e:
        return Health(False, False, False, f"adb server could not list devices: {e}")
    if state != "device":
        return Health(False, False, False, f"adb state '{state}' on {server}" if state
                      else f"not listed on {server}")
    try:
        result = DeviceTransport(client, serial, server).shell(
            f"echo {ALIVE}; getprop sys.boot_completed", timeout=timeout_s)
    except InfraError as e:
        return Health(True, False, False, f"shell did not answer: {e}",
                      server_down=isinstance(e, AdbServerDown))
    lines = result.out.split("\n")
    if result.exit_code != 0 or lines[0].strip() != ALIVE:
        return Health(True, False, False, f"shell answered exit {result.exit_code}: "
                                          f"{short((result.out + result.err).strip())!r}")
    boot_completed = lines[1].strip() if len(lines) > 1 else ""
    if boot_completed == "1":
        return Health(True, True, True, "answering, booted")
    return Health(True, True, False, f"answering, still booting (sys.boot_completed={boot_completed!r})")


@dataclass(frozen=True)
class Rung:
    name: str
    ok: bool  # the rung's own goal was reached (the device may still need the next one)
    seconds: float
    detail: str

    def describe(self) -> str:
        return f"{self.name}: {'ok' if self.ok else 'no'} after {self.seconds:.1f}s ({self.detail})"


@dataclass(frozen=True)
class Recovery:
    serial: str
    before: Health
    after: Health
    rungs: tuple[Rung, ...] = ()
    seen_listed: bool = False  # listed as "device" at some look (before, during or after the ladder)

    @property
    def verdict(self) -> str:
        if self.before.healthy:
            return HEALTHY
        if self.after.healthy:
            return RECOVERED
        if self.after.server_down:
            return SERVER_DOWN
        return FAILED if self.seen_listed else ABSENT

    def describe(self) -> str:
        """One line: the verdict, the rungs climbed, the last look at the device."""
        climbed = "; ".join(r.describe() for r in self.rungs) or "no rung tried"
        return f"{self.verdict}: was {self.before.detail}; {climbed}; now {self.after.detail}"


@dataclass
class _Looker:
    """Probes with their bookkeeping: the last look, and whether the device was ever listed."""

    server: AdbServerAddress
    serial: str
    probe: Callable[[AdbServerAddress, str], Health]
    last: Health | None = None
    seen_listed: bool = False

    def look(self) -> Health:
        self.last = self.probe(self.server, self.serial)
        self.seen_listed = self.seen_listed or self.last.listed
        return self.last

    def wait(self, until: Callable[[Health], bool], timeout_s: float,
             clock: Callable[[], float], sleep: Callable[[float], None]) -> bool:
        deadline = clock() + timeout_s
        while True:
            if until(self.look()):
                return True
            if clock() >= deadline:
                return False
            sleep(min(POLL_S, max(0.0, deadline - clock())))


def recover(server: AdbServerAddress, serial: str, config: RecoveryConfig, *,
            on_rung: Callable[[Rung], None] = lambda rung: None,
            probe_device: Callable[[AdbServerAddress, str], Health] | None = None,
            reboot: Callable[[AdbServerAddress, str], None] | None = None,
            clock: Callable[[], float] = time.monotonic,
            sleep: Callable[[float], None] = time.sleep) -> Recovery:
    """Look at the device; while it is unhealthy, climb the configured rungs (``on_rung`` is told of
    each as it ends). Never raises for the device's or its server's trouble: the verdict says it."""
    looker = _Looker(server, serial, probe_device or (
        lambda server, serial: probe(server, serial, timeout_s=config.probe_timeout_s)))
    before = looker.look()
    rungs: list[Rung] = []
    if not before.healthy and not before.server_down:
        for name in config.rungs:
            started = clock()
            ok, detail = _climb(name, looker, config, reboot or _adb_reboot, clock, sleep)
            rung = Rung(name, ok, round(clock() - started, 3), detail)
            rungs.append(rung)
            on_rung(rung)
            if looker.last is not None and (looker.last.healthy or looker.last.server_down):
                break
            if name == "return" and not looker.seen_listed:
                break  # never listed: it is absent, and neither a boot nor a reboot reaches it
    return Recovery(serial, before, looker.last or before, tuple(rungs), looker.seen_listed)


def _climb(name: str, looker: _Looker, config: RecoveryConfig,
           reboot: Callable[[AdbServerAddress, str], None],
           clock: Callable[[], float], sleep: Callable[[float], None]) -> tuple[bool, str]:
    def stop(h: Health) -> bool:  # a server that went down ends every wait: nothing more to learn
        return h.server_down

    if name == "return":
        ok = looker.wait(lambda h: (h.listed and h.answers) or stop(h), config.return_timeout_s,
                         clock, sleep)
        return ok and not looker.last.server_down, _said(looker, config.return_timeout_s, ok)
    if name == "boot":
        ok = looker.wait(lambda h: h.healthy or stop(h), config.boot_timeout_s, clock, sleep)
        return ok and not looker.last.server_down, _said(looker, config.boot_timeout_s, ok)
    # reboot
    if not looker.look().listed:
        return False, f"cannot send adb reboot: {looker.last.detail}"
    try:
        reboot(looker.server, looker.serial)
    except InfraError as e:
        return False, f"adb reboot failed: {e}"
    # Only an unhealthy device is rebooted: a healthy look from here on is the new boot's.
    ok = looker.wait(lambda h: h.healthy or stop(h), config.reboot_timeout_s, clock, sleep)
    return ok and not looker.last.server_down, _said(looker, config.reboot_timeout_s, ok)


def _said(looker: _Looker, timeout_s: float, ok: bool) -> str:
    last = looker.last.detail if looker.last is not None else "not looked at"
    return last if ok else f"not within {timeout_s:g}s: {last}"


def _adb_reboot(server: AdbServerAddress, serial: str) -> None:
    DeviceTransport(client_for(server), serial, server).reboot()
