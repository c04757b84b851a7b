"""Opening a farm for a run: adb servers, the pool, and (optionally) fresh virtual devices.

Used by ``farm qualify`` and the pytest plugin alike, so that "bring up virtual devices, discover,
sync the pool, pick SoCs" is written once:

    with open_farm(config, virtual=[("SM8650", 2), ("SM8550", 1)], workdir=tmp) as farm:
        farm.inventory()            # {"SM8550": 1, "SM8650": 2}: devices that can take work
        farm.pick_socs(["SM8650"])  # checked against the inventory: an unknown SoC fails at once

A ``FarmAddress`` is what another process (a pytest-xdist worker) needs to find the same farm without
starting anything: the pool URL, the adb servers and the device workspace; with the config's pool
settings (``Pool.open(url, config.pool)``) it uses it as the owner does.
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from farm.config import AdbServerAddress, FarmConfig, RecoveryConfig
from farm.device import recovery
from farm.device.discovery import scan_server
from farm.device.probe import Device, DeviceInfo
from farm.device.transport import client_for, list_server
from farm.errors import AdbError, InfraError, LeaseTimeout, PoolError, UsageError
from farm.pool import AVAILABLE, LEASED, OFFLINE, Holder, LeaseRequest, Pool

log = logging.getLogger(__name__)


def parse_soc_counts(socs: Sequence[str], counts: Sequence[int] = ()) -> list[tuple[str, int]]:
    """Pair SoCs and counts: ``SM8650:2``; or one count per SoC, in order; or a single count for
    every SoC. No SoC at all: one SM8650."""
    from farm.virtual import SOC_PROFILES

    if not socs:
        socs = ("SM8650",)
    if counts and len(counts) not in (1, len(socs)):
        raise UsageError(f"--count given {len(counts)} times for {len(socs)} --soc: give one "
                         f"--count per --soc, a single --count for all, or use --soc SOC:N")
    pairs = []
    for i, item in enumerate(socs):
        soc, sep, n = item.partition(":")
        soc = soc.strip().upper()
        if soc not in SOC_PROFILES:
            raise UsageError(f"{item}: unknown SoC '{soc}' (known: {', '.join(sorted(SOC_PROFILES))})")
        if sep:
            if counts:
                raise UsageError(f"{item}: give the count either as SOC:N or with --count")
            if not n.isdigit() or int(n) < 1:
                raise UsageError(f"{item}: count after ':' must be a positive integer")
            count = int(n)
        else:
            count = counts[i if len(counts) > 1 else 0] if counts else 1
        if count < 1:
            raise UsageError(f"--count {count}: must be at least 1")
        pairs.append((soc, count))
    return pairs


@dataclass(frozen=True)
class FarmAddress:
    """Where a farm is, enough to attach to it from another process: its pool, its adb servers and the
    device workspace. How the farm is used (TTLs, timeouts) is the config's (farm.config)."""

    pool_url: str
    servers: tuple[str, ...]
    workspace: str
    virtual: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> FarmAddress:
        raw = json.loads(text)
        raw["servers"] = tuple(raw["servers"])
        return cls(**raw)

    @property
    def adb_servers(self) -> list[AdbServerAddress]:
        return [AdbServerAddress.parse(s) for s in self.servers]


def watch_interval(liveness_s: float | None) -> float:
    """How often a farm's owner refreshes its devices' liveness, well within the bound: a quarter of
    it, between 0.5 and 30 seconds."""
    return 30.0 if liveness_s is None else min(30.0, max(0.5, liveness_s / 4))


# What a device needs to pass the scheduled health check, as the smoke suite's device tests ask:
# a shell that answers, a finished boot, and room in the workspace for run outputs and a small deploy.
HEALTH_MIN_FREE_BYTES = 64 << 20
HEALTH_LEASE_TTL_S = 600.0  # a health check holds its device at most this long (a ladder's reboot)


@dataclass(frozen=True)
class HealthCheck:
    """One device's scheduled health check: ``passed``, ``recovered`` (the ladder brought it back),
    ``quarantined`` (taken out of service, ``detail`` says why) or ``busy`` (leased meanwhile: not
    checked)."""

    serial: str
    verdict: str
    detail: str


@dataclass
class Farm:
    """An open farm: its address, a pool handle, and the virtual devices it started (if any)."""

    address: FarmAddress
    pool: Pool
    virtual_farm: object | None = None  # farm.virtual.VirtualFarm when the run started its own
    unreachable: list[str] = field(default_factory=list)  # adb servers that did not answer

    @property
    def servers(self) -> list[AdbServerAddress]:
        return self.address.adb_servers

    def sync(self) -> list[DeviceInfo]:
        """Discover every device of every server and merge it into the pool, once.

        One rule for unreachable servers: their devices go offline in the pool, a warning names the
        server, and only when no server answers is it an error (``AdbError``)."""
        found: list[DeviceInfo] = []
        reachable: list[AdbServerAddress] = []
        self.unreachable = []
        for server in self.servers:
            scan = scan_server(server, workspace_root=self.address.workspace)
            if scan.error:
                log.warning("adb server %s: %s", server, scan.error)
                self.unreachable.append(scan.error)
                continue
            reachable.append(server)
            found.extend(scan.devices)
        if not reachable:
            raise AdbError("no adb server answered: " + "; ".join(self.unreachable))
        self.pool.sync(found, reachable)
        for server in self.servers:
            if server not in reachable:  # its devices cannot be used: offline until it answers
                self.pool.sync([], [server])
        return found

    def refresh(self, *, take_offline: bool = True) -> list[str]:
        """One cheap liveness pass: ask each adb server for its device list (no command runs on any
        device) and mark the usable devices seen. A server whose list differs from the pool (a device
        new, back, gone or no longer usable) gets a full sync of its devices; one that does not
        answer has its devices go offline, as in ``sync`` (unless ``take_offline`` is False). Returns
        the servers that were fully synced; ``unreachable`` names those that did not answer. Never
        raises for adb."""
        self.unreachable = []
        synced: list[str] = []
        online = {}
        for status in self.pool.status().devices:
            d = status.device
            if d.present and d.state != OFFLINE:
                online.setdefault(d.server, set()).add(d.serial)
        for server in self.servers:
            try:
                entries = list_server(client_for(server), server)
            except AdbError as e:
                log.warning("adb server %s: %s", server, e)
                self.unreachable.append(str(e))
                if take_offline:
                    self.pool.sync([], [server])
                continue
            usable = [serial for serial, state in entries if state == "device"]
            changed = self.pool.touch(usable)
            if changed or set(usable) != online.get(str(server), set()):
                scan = scan_server(server, workspace_root=self.address.workspace)
                if scan.error:
                    self.unreachable.append(scan.error)
                self.pool.sync(scan.devices, [server])
                synced.append(str(server))
        return synced

    def check_health(self, ladder: RecoveryConfig) -> list[HealthCheck]:
        """One scheduled health check of every idle device of this farm's servers, each under a lease
        (nobody is handed a device while it is checked, and a device leased meanwhile is skipped,
        never waited for): a shell answers, the boot is finished, the workspace has room. A device
        that fails climbs the recovery ladder; one the ladder cannot bring back, or whose workspace is
        full, is quarantined with the reason. Every step is in the pool's history."""
        ours = {str(s) for s in self.servers}
        idle = [st.device for st in self.pool.status().devices
                if st.device.state == AVAILABLE and st.device.present and st.device.server in ours]
        holder = Holder.current(purpose="farm pool watch --health")
        checks = []
        for device in idle:
            try:
                lease = self.pool.acquire(LeaseRequest(serial=device.serial), holder,
                                          ttl_s=HEALTH_LEASE_TTL_S, timeout_s=0)
            except (LeaseTimeout, PoolError) as e:
                checks.append(HealthCheck(device.serial, "busy", str(e).split(";")[0]))
                continue
            with lease:
                checks.append(self._check_one(device.serial, device.server, bool(device.virtual),
                                              ladder))
        return checks

    def _check_one(self, serial: str, server_text: str, virtual: bool,
                   ladder: RecoveryConfig) -> HealthCheck:
        server = AdbServerAddress.parse(server_text)
        config = recovery.for_virtual(ladder) if virtual else ladder
        # The ladder's first look is the health check's own: a healthy device climbs no rung.
        result = recovery.recover(server, serial, config, on_rung=lambda rung: self.pool.record_recovery(
            serial, f"health check: rung {rung.describe()}"))
        health = result.before
        if not health.healthy:
            self.pool.record_recovery(serial, f"health check: {result.describe()}"[:1000])
            if result.verdict != recovery.RECOVERED:
                why = f"health check failed: {health.detail}; recovery: {result.verdict}"
                self.pool.quarantine(serial, why[:1000])
                return HealthCheck(serial, "quarantined", why)
        free = _free_bytes(server, serial, self.address.workspace)
        if free is not None and free < HEALTH_MIN_FREE_BYTES:
            why = (f"health check failed: {free} bytes free in the workspace, needs at least "
                   f"{HEALTH_MIN_FREE_BYTES}")
            self.pool.quarantine(serial, why)
            return HealthCheck(serial, "quarantined", why)
        self.pool.record_success(serial)
        return HealthCheck(serial, "passed" if health.healthy else "recovered", health.detail)

    def inventory(self) -> dict[str, int]:
        """SoC -> devices that can take work now or soon (available or leased; not offline,
        quarantined or absent)."""
        return {soc: len(serials) for soc, serials in self.units().items()}

    def any_virtual(self) -> bool:
        """Whether a device that can take work now or soon is a virtual one (its properties said so
        when the pool last saw it)."""
        return any(s.device.virtual for s in self.pool.status().devices
                   if s.device.soc and s.device.present and s.device.state in (AVAILABLE, LEASED))

    def units(self) -> dict[str, list[str]]:
        """SoC -> the serials of its devices that can take work now or soon, sorted."""
        units: dict[str, list[str]] = {}
        for status in self.pool.status().devices:
            d = status.device
            if d.soc and d.present and d.state in (AVAILABLE, LEASED):
                units.setdefault(d.soc, []).append(d.serial)
        return {soc: sorted(serials) for soc, serials in sorted(units.items())}

    def pick_socs(self, wanted: Sequence[str]) -> list[str]:
        """The SoCs a run covers: ``wanted`` (checked) or every SoC the pool can serve."""
        have = self.inventory()
        if not wanted:
            if not have:
                raise UsageError("the pool has no usable device with a known SoC: nothing to run on "
                                 "(start virtual ones with --farm-virtual SM8650:2, or see `farm pool "
                                 "status`)")
            return list(have)
        picked = list(dict.fromkeys(s.strip().upper() for s in wanted))
        missing = [s for s in picked if s not in have]
        if missing:
            listed = ", ".join(f"{s} ({n})" for s, n in have.items()) or "no usable device"
            raise UsageError(f"no device for SoC {', '.join(missing)} in the pool; it has: {listed}")
        return picked


def _free_bytes(server: AdbServerAddress, serial: str, workspace_root: str) -> int | None:
    """The device's free bytes in its workspace; None when it does not say (df) or cannot be asked."""
    try:
        return Device(client_for(server), serial, server, workspace_root=workspace_root).info().free_bytes
    except InfraError as e:
        log.warning("health check of %s: free space unknown: %s", serial, e)
        return None


@contextlib.contextmanager
def _every(interval_s: float, beat: Callable[[], bool | None], name: str) -> Iterator[threading.Thread]:
    """Call ``beat`` every ``interval_s`` seconds from a daemon thread while the block runs; a beat that
    returns False ends the loop. Errors are logged, never raised: a watcher never takes a run down."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval_s):
            try:
                if beat() is False:
                    return
            except Exception as e:
                log.warning("%s: %s: %s", name, type(e).__name__, e)

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        stop.set()
        thread.join(timeout=60)


def healing(vf, interval_s: float = 1.0):
    """While the block runs, the owner of virtual devices keeps their adb server up: a server that
    died (killed, crashed) is restarted and the live devices reconnected (``VirtualFarm.heal``,
    bounded). Tests see an ``AdbServerDown`` for the commands cut off, then a working farm again."""
    def beat() -> bool:
        try:
            report = vf.heal()
        except InfraError as e:  # past its restart budget: stop trying, the errors name the server
            log.warning("cannot heal the virtual devices' adb server: %s", e)
            return False
        if report.changed:
            log.warning("healed %s: restarted=%s, reconnected %s", report.server,
                        report.server_restarted, report.reconnected)
        return True

    return _every(interval_s, beat, "ptefarm-adb-healer")


def watching(farm: Farm, interval_s: float | None = None):
    """While the block runs, keep the farm's devices fresh in the pool (``Farm.refresh`` every
    ``interval_s``, by default well within the pool's liveness bound): a run's devices stay
    leasable however long it lasts, and one that dies goes offline within the interval."""
    return _every(watch_interval(farm.pool.liveness_s) if interval_s is None else interval_s,
                  farm.refresh, "ptefarm-liveness")


def configured_address(config: FarmConfig) -> FarmAddress:
    """The address of the farm a config describes (its adb servers and pool)."""
    return FarmAddress(pool_url=config.pool.url, servers=tuple(str(s) for s in config.adb_servers),
                       workspace=config.run.workspace)


def refresh_configured(config: FarmConfig, pool: Pool) -> None:
    """One cheap liveness pass over the configured adb servers that answer (their device lists; no
    command runs on a device), so that a shell lease is not kept waiting for devices that are there but
    were not seen lately. A server that does not answer is left alone (taking its devices offline is
    `farm pool sync`'s business). Never raises for adb or the pool: the lease that follows reports what
    is wrong."""
    if config.tunnels:
        from farm.device.tunnel import ensure_tunnels

        for tunnel in config.tunnels:  # a server reached over SSH is listed through its forward
            try:
                ensure_tunnels([tunnel], log_dir=config.home / "tunnels")
            except InfraError as e:
                log.warning("refresh before leasing: %s", e)
    try:
        Farm(address=configured_address(config), pool=pool).refresh(take_offline=False)
    except InfraError as e:
        log.warning("refresh before leasing: %s", e)


def open_tunnels(config: FarmConfig) -> None:
    """The config's adb servers reached over SSH, forwarded to this host and supervised
    (farm.device.tunnel); nothing without ssh entries."""
    if config.tunnels:
        from farm.device.tunnel import ensure_tunnels

        ensure_tunnels(config.tunnels, log_dir=config.home / "tunnels")


def open_tunnel_for(config: FarmConfig, server: str) -> bool:
    """The SSH forward behind adb server ``server`` ("127.0.0.1:PORT"), when the config reaches that
    server over SSH: up (this process's, or another's on this host) and supervised while this
    process runs, for a command about to talk to it. False: ``server`` is no forward of the config's.
    Without it, an adb client would find nothing on the forward's port and start a local server of
    its own there."""
    wanted = [t for t in config.tunnels if f"127.0.0.1:{t.local_port}" == str(server)]
    if not wanted:
        return False
    from farm.device.tunnel import ensure_tunnels

    ensure_tunnels(wanted, log_dir=config.home / "tunnels")
    return True


@contextlib.contextmanager
def open_farm(config: FarmConfig, *, virtual: Sequence[tuple[str, int]] = (),
              workdir: Path | None = None, watch: bool = True) -> Iterator[Farm]:
    """Open the configured farm, or with ``virtual`` a private one: fresh virtual devices on an adb
    server of their own and a SQLite pool in ``workdir`` (a temporary directory by default), all
    stopped on exit. Either way the pool is synced with what the adb servers see, and with ``watch``
    kept fresh while the farm is open (``watching``: the devices stay within the pool's liveness
    bound however long the run takes)."""
    with contextlib.ExitStack() as stack:
        vf = None
        if virtual:
            from farm.virtual import VirtualDeviceSpec, VirtualFarm

            specs = [VirtualDeviceSpec(soc=soc, timing=config.virtual.timing)
                     for soc, n in virtual for _ in range(n)]
            if workdir is None:
                workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ptefarm-")))
            workdir.mkdir(parents=True, exist_ok=True)
            vf = stack.enter_context(VirtualFarm(home=workdir / "farm", adb_port=None))
            vf.up(specs)
            stack.enter_context(healing(vf))
            address = FarmAddress(pool_url=f"sqlite:///{workdir / 'pool.db'}",
                                  servers=(str(vf.adb_server),), workspace=config.run.workspace,
                                  virtual=True)
        else:
            open_tunnels(config)
            address = configured_address(config)
        # The configured settings either way; the config's device tags are for the configured pool
        # (a virtual run's devices are not the config's phones).
        pool = stack.enter_context(Pool.open(address.pool_url, config.pool,
                                             device_tags=None if virtual else config.device_tags))
        farm = Farm(address=address, pool=pool, virtual_farm=vf)
        farm.sync()
        if watch:
            stack.enter_context(watching(farm))
        yield farm
