"""The qualification run: every requested SoC runs every case, on leased devices, in parallel.

A scheduler you can read in one sitting: work items are (SoC, case) pairs in per-SoC queues. Each worker
thread leases any device whose SoC still has work, deploys the bundle once, then drains that SoC's queue.
An infrastructure error (device gone, adb error, timeout) is recorded against the device in the pool, the
lease is released and the item goes back to the queue to be retried, usually on another device; after
``max_attempts`` it is reported as an error, never as a failure. Token mismatches are failures.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from farm import bundle as bundle_mod
from farm.compare import compare_updaters
from farm.config import AdbServerAddress
from farm.deploy import deploy
from farm.devices import find_device
from farm.errors import InfraError, LeaseTimeout, UsageError
from farm.pool import Holder, LeaseRequest, Pool
from farm.run import RunnerFailed

PASSED, FAILED, ERROR = "passed", "failed", "error"

# Prompts a release is qualified on: plain text, and a hostile one (shell metacharacters, quotes, a
# chat-template marker, non-ASCII, a newline) that must reach the runner as data.
DEFAULT_PROMPTS = {
    "story": "Once upon a time, there was a little girl named Lily.",
    "hostile": "Say \"hi\" $(reboot) `id`; echo '<|eot_id|>' ü\nok",
}


@dataclass(frozen=True)
class Case:
    name: str
    mode: str
    prompt: str
    seq_len: int

    @property
    def id(self) -> str:
        return f"updaters_agree[{self.mode}-{self.name}]"


@dataclass
class CaseResult:
    case: Case
    soc: str
    outcome: str
    message: str
    serial: str | None = None
    duration_s: float = 0.0
    attempts: int = 1
    tok_s: dict[str, float | None] = field(default_factory=dict)
    decode_tok_s: dict[str, float | None] = field(default_factory=dict)
    infra_log: list[str] = field(default_factory=list)  # infra errors of earlier attempts


@dataclass
class QualifyPlan:
    manifest: Path
    socs: list[str]
    cases: list[Case]
    priority: int = 100
    lease_timeout_s: float = 120.0
    run_timeout_s: float = 300.0
    max_attempts: int = 3


@dataclass
class _Item:
    soc: str
    case: Case
    attempts: int = 0
    infra_log: list[str] = field(default_factory=list)


def default_cases(bundle: bundle_mod.Bundle, seq_len: int = 128) -> list[Case]:
    context = int(bundle.model.get("max_seq_len", seq_len))
    return [Case(name=name, mode=mode, prompt=prompt, seq_len=min(seq_len, context))
            for mode in sorted(bundle.modes) for name, prompt in DEFAULT_PROMPTS.items()]


class Qualification:
    def __init__(self, plan: QualifyPlan, pool: Pool, servers: list[AdbServerAddress], *,
                 workers: int, on_result: Callable[[CaseResult], None] | None = None):
        self.plan = plan
        self.bundle = bundle_mod.load(plan.manifest)
        self.pool = pool
        self.servers = {str(s): s for s in servers}
        self.workers = max(1, workers)
        self.on_result = on_result or (lambda r: None)
        self.results: list[CaseResult] = []
        self._queues: dict[str, collections.deque[_Item]] = {
            soc: collections.deque(_Item(soc, c) for c in plan.cases) for soc in plan.socs}
        self._in_flight = 0
        self._lock = threading.Condition()

    # -- the queue ------------------------------------------------------------------------------
    def _pending_socs(self) -> list[str]:
        return [soc for soc, q in self._queues.items() if q]

    def _take(self, soc: str) -> _Item | None:
        with self._lock:
            if not self._queues[soc]:
                return None
            self._in_flight += 1
            return self._queues[soc].popleft()

    def _done(self, item: _Item, result: CaseResult | None) -> None:
        with self._lock:
            self._in_flight -= 1
            if result is None:
                self._queues[item.soc].appendleft(item)
            else:
                result.attempts = item.attempts
                result.infra_log = list(item.infra_log)
                self.results.append(result)
            self._lock.notify_all()
        if result is not None:
            self.on_result(result)

    def _finished(self) -> bool:
        with self._lock:
            return not self._pending_socs() and self._in_flight == 0

    # -- a worker -------------------------------------------------------------------------------
    def _worker(self, index: int) -> None:
        holder = Holder.current(purpose=f"farm qualify worker {index}")
        while True:
            with self._lock:
                while not self._pending_socs() and self._in_flight:
                    self._lock.wait(0.5)  # an in-flight item may come back after an infra error
                socs = self._pending_socs()
            if not socs:
                return
            request = LeaseRequest(socs=tuple(socs), priority=self.plan.priority)
            try:
                lease = self.pool.acquire(request, holder, timeout_s=self.plan.lease_timeout_s)
            except LeaseTimeout as e:
                self._give_up(socs, f"no device could be leased: {e}")
                return
            with lease:
                self._drain(lease)

    def _drain(self, lease) -> None:
        soc = lease.device.soc
        serial = lease.serial
        try:
            device = find_device([self._server(lease.server)], serial)
            deploy(device, self.bundle)
        except InfraError as e:
            self._infra_failure(serial, f"deploy: {e}")
            return
        while (item := self._take(soc)) is not None:
            item.attempts += 1
            started = time.monotonic()
            try:
                cmp = compare_updaters(device, self.bundle, mode=item.case.mode,
                                       prompt=item.case.prompt, seq_len=item.case.seq_len,
                                       timeout=self.plan.run_timeout_s)
            except InfraError as e:
                item.infra_log.append(f"{serial}: {type(e).__name__}: {e}")
                self._infra_failure(serial, str(e))
                if item.attempts >= self.plan.max_attempts:
                    self._done(item, CaseResult(item.case, soc, ERROR, item.infra_log[-1], serial,
                                                time.monotonic() - started))
                else:
                    self._done(item, None)  # back to the queue: retried on another lease
                return  # this device just failed: let the pool decide whether it gets more work
            except RunnerFailed as e:
                self._done(item, CaseResult(item.case, soc, FAILED, f"runner failed: {e}", serial,
                                            time.monotonic() - started))
                continue
            except UsageError as e:
                self._done(item, CaseResult(item.case, soc, ERROR, f"bad input: {e}", serial,
                                            time.monotonic() - started))
                continue
            self.pool.record_success(serial)
            self._done(item, CaseResult(
                item.case, soc, PASSED if cmp.agree else FAILED, cmp.explain(), serial,
                time.monotonic() - started, tok_s=cmp.tok_s(),
                decode_tok_s={u: r.decode_tok_s for u, r in cmp.results.items()}))

    def _server(self, text: str) -> AdbServerAddress:
        return self.servers.get(text) or AdbServerAddress.parse(text)

    def _infra_failure(self, serial: str, reason: str) -> None:
        try:
            self.pool.record_infra_failure(serial, reason)
        except InfraError:
            pass  # the pool being down must not hide the device's own error

    def _give_up(self, socs: list[str], message: str) -> None:
        for soc in socs:
            while (item := self._take(soc)) is not None:
                self._done(item, CaseResult(item.case, soc, ERROR, message, None, 0.0))

    def run(self) -> list[CaseResult]:
        threads = [threading.Thread(target=self._worker, args=(i,), name=f"qualify-{i}", daemon=True)
                   for i in range(self.workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # Workers only stop when the queues are empty; anything left means every worker gave up.
        self._give_up(self._pending_socs(), "no worker left to run it")
        order = {soc: i for i, soc in enumerate(self.plan.socs)}
        self.results.sort(key=lambda r: (order[r.soc], r.case.mode, r.case.name))
        return self.results
