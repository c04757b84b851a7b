"""Deploy's push pipeline (farm/execute/deploy.py): several files in flight, host files hashed as streamed.

- concurrent pushes leave exactly the manifest's bytes on the device, and the record their digests;
- a file corrupted on the device is pushed again (a moved mtime in "fast", any change in "full");
- a host file changed while it is pushed is refused, whichever way its digest was taken;
- an interrupted deploy (a failing push, Ctrl-C) stops the other pushes and leaves no file under its
  real name that was not there before, no partial file and no record vouching for anything;
- the pushes in flight are bounded: at most ``IN_FLIGHT`` at once, and Python's memory peak of a
  deploy does not grow with the bytes pushed;
- a new bundle is read once (hashed in the pass that pushes it), and a host read error is the
  bundle's, not the device's.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from farm.bundle import manifest as bundle_mod
from farm.device.discovery import find_device
from farm.errors import AdbError, UsageError
from farm.execute import deploy as deploy_mod
from farm.execute.deploy import IN_FLIGHT, PARTIAL_SUFFIX, RECORD_NAME, bundle_workspace, deploy
from farm.virtual import VirtualDeviceSpec, VirtualFarm
from tests.support.devices import wait_for_sync_sessions_to_end
from tests.support.fake_device import FakeDevice
from tests.support.random_bundle import make_bundle

MB = 1 << 20


@pytest.fixture(scope="module")
def virtual(tmp_path_factory):
    with VirtualFarm(home=tmp_path_factory.mktemp("pipeline-farm")) as vf:
        (record,) = vf.up([VirtualDeviceSpec(soc="SM8650")])
        yield vf, record


@pytest.fixture
def device(virtual):
    vf, record = virtual
    device = find_device([vf.adb_server], record.serial)
    device.vf = vf  # for _ws: where the device's storage is on the host
    return device




SIZES = {"model.pte": 3 * MB + 17, "libA.so": 700_001, "libB.so": 300_000, "libC.so": 1, "empty.so": 0}


def _ws(device, bundle) -> Path:
    """The bundle's workspace as a host path (a virtual device's storage is a host directory)."""
    return device.vf.device(device.serial).host_path(bundle_workspace(device, bundle))


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _nothing_claims_completion(device, ws: Path, before: set[str]) -> None:
    """No new file under a real name, no partial file, no record, once the device's sync sessions
    have ended (a device's sync service removes the temporary file of a push cut off mid-way itself,
    when its session ends, as adbd does)."""
    wait_for_sync_sessions_to_end(device.vf, device.serial)
    names = {p.name for p in ws.iterdir()} if ws.exists() else set()
    assert not [n for n in names if PARTIAL_SUFFIX in n]
    assert RECORD_NAME not in names
    assert names - before == set()


@pytest.fixture(params=["digest of a verify", "hashed as streamed"])
def digest_path(request, monkeypatch):
    """Both ways a pushed file's digest is taken: the one a verify in this process took (RACY_NS 0:
    every file is settled, so the digests make_bundle takes stay cached, as a verify leaves them), or
    the bytes hashed as they are streamed (nothing cached)."""
    monkeypatch.setattr(bundle_mod, "_digest_cache", {})
    monkeypatch.setattr(bundle_mod, "RACY_NS", 0 if request.param == "digest of a verify" else 10**18)
    return request.param


class CountingDevice:
    """A device whose pushes are slowed (so they overlap) and counted: the most at once."""

    def __init__(self, inner, delay: float = 0.05):
        self.inner = inner
        self.delay = delay
        self.active = self.most = 0
        self._lock = threading.Lock()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def push(self, src, remote, **kwargs):
        with self._lock:
            self.active += 1
            self.most = max(self.most, self.active)
        try:
            time.sleep(self.delay)
            return self.inner.push(src, remote, **kwargs)
        finally:
            with self._lock:
                self.active -= 1


def test_concurrent_pushes_leave_exactly_the_manifests_bytes(device, tmp_path, digest_path):
    bundle = make_bundle(tmp_path / "b", f"concurrent-{digest_path.split()[0]}", SIZES)
    counting = CountingDevice(device)
    report = deploy(counting, bundle)
    assert counting.most > 1  # the files really were in flight together
    assert sorted(report.pushed) == sorted(SIZES) and report.bytes_pushed == sum(SIZES.values())
    ws = _ws(device, bundle)
    for f in bundle.files:
        assert (ws / f.name).read_bytes() == f.path.read_bytes()
    record = json.loads((ws / RECORD_NAME).read_text())["files"]
    assert {n: e["sha256"] for n, e in record.items()} == {n: _sha(ws / n) for n in SIZES}
    assert not [p for p in ws.iterdir() if PARTIAL_SUFFIX in p.name]
    again = deploy(device, bundle)
    assert (again.files_pushed, again.files_hashed, again.files_skipped) == (0, 0, len(SIZES))


@pytest.mark.parametrize("verify,restore_mtime", [("fast", False), ("full", True)])
def test_a_file_corrupted_on_the_device_is_pushed_again(device, tmp_path, verify, restore_mtime):
    bundle = make_bundle(tmp_path / "b", f"corrupt-{verify}", SIZES)
    deploy(device, bundle)
    ws = _ws(device, bundle)
    target = ws / "libA.so"
    st = target.stat()
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte off
    target.write_bytes(bytes(data))
    if restore_mtime:  # only "full" can see this one: size and mtime are what the record says
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    report = deploy(device, bundle, verify=verify)
    assert report.pushed == ["libA.so"]
    assert target.read_bytes() == (tmp_path / "b" / "libA.so").read_bytes()
    assert deploy(device, bundle).files_pushed == 0


def test_a_host_file_changed_while_pushed_is_refused(device, tmp_path, digest_path):
    bundle = make_bundle(tmp_path / "b", f"changing-{digest_path.split()[0]}", {"model.pte": 4 * MB})
    host = tmp_path / "b" / "model.pte"
    changed = threading.Event()

    def change_once(name, n):  # same size, other bytes, while the push is under way
        if not changed.is_set():
            changed.set()
            host.write_bytes(os.urandom(4 * MB))

    with pytest.raises(UsageError, match="model.pte changed"):
        deploy(device, bundle, on_progress=change_once)
    assert changed.is_set()
    _nothing_claims_completion(device, _ws(device, bundle), set())


@pytest.mark.parametrize("how", ["a push fails", "ctrl-c"])
def test_an_interrupted_deploy_leaves_nothing_that_claims_to_be_complete(device, tmp_path, how):
    bundle = make_bundle(tmp_path / "b", f"interrupted-{how[0]}", SIZES)
    ws = _ws(device, bundle)
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "stale.txt").write_bytes(b"found there")  # what was there stays, nothing is added
    seen: dict[str, int] = {}
    small_done = threading.Event()

    def interrupt(name, n):
        seen[name] = seen.get(name, 0) + n
        if seen.get("libA.so") == SIZES["libA.so"]:
            small_done.set()  # a smaller file finished its push ...
        if name == "model.pte" and small_done.is_set() and seen[name] > MB:  # ... the big one not
            raise KeyboardInterrupt if how == "ctrl-c" else AdbError("device fell over")

    class BigLast(CountingDevice):
        """The big file's push waits for a small one to finish: otherwise, on a fast device, it can
        be done before the small one starts, and the interruption this test needs never comes."""

        def push(self, src, remote, **kwargs):
            if "model.pte" in str(remote):  # its temporary name: model.pte.<suffix>
                small_done.wait(60)
            return super().push(src, remote, **kwargs)

    counting = BigLast(device, delay=0)
    with pytest.raises(KeyboardInterrupt if how == "ctrl-c" else AdbError):
        deploy(counting, bundle, on_progress=interrupt)
    assert small_done.is_set()
    assert counting.active == 0  # no push still running once deploy has returned
    _nothing_claims_completion(device, ws, {"stale.txt"})

    report = deploy(device, bundle)  # the next deploy starts from scratch and completes
    assert sorted(report.pushed) == sorted(SIZES)
    for f in bundle.files:
        assert (ws / f.name).read_bytes() == f.path.read_bytes()


def test_pushes_in_flight_are_bounded_in_number_and_memory(device, tmp_path, monkeypatch):
    sizes = {f"part{i}.pte": 8 * MB for i in range(8)}
    bundle = make_bundle(tmp_path / "b", "bounded", sizes)
    monkeypatch.setattr(bundle_mod, "_digest_cache", {})  # every byte hashed as it is streamed
    counting = CountingDevice(device)
    tracemalloc.start()
    try:
        report = deploy(counting, bundle)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.bytes_pushed == 64 * MB
    assert counting.most == IN_FLIGHT
    # Per push in flight: its ~1 MiB block, and the reader's blocks read ahead (the queue, the one
    # being read, the one being handed over); and small change: far below the 64 MiB pushed (a
    # pipeline that queued blocks without bound would hold most of them).
    per_push = MB + (deploy_mod.READ_AHEAD + 2) * deploy_mod.READ_BLOCK
    assert peak < IN_FLIGHT * per_push + 4 * MB, f"peak {peak / MB:.1f} MiB"


def test_a_new_bundle_is_read_once_and_its_digests_serve_the_next_device(tmp_path, monkeypatch):
    """Nothing cached (a bundle ``farm deploy`` meets for the first time): each file is hashed in the
    pass that pushes it, never read for a hash of its own, and the digests learned (the files are
    settled) let the push to a second device skip hashing; the bytes on both are the manifest's."""
    monkeypatch.setattr(bundle_mod, "RACY_NS", 0)  # every file settled without waiting a second
    bundle = make_bundle(tmp_path / "b", "read-once", SIZES)
    monkeypatch.setattr(bundle_mod, "_digest_cache", {})
    hashed_apart: list[str] = []
    real = bundle_mod.sha256_file
    monkeypatch.setattr(bundle_mod, "sha256_file", lambda path, *a: hashed_apart.append(path) or
                        real(path, *a))
    streamed: list[bool] = []
    real_source = deploy_mod._Source

    def source(raw, cancel, *, hashing):
        streamed.append(hashing)
        return real_source(raw, cancel, hashing=hashing)

    monkeypatch.setattr(deploy_mod, "_Source", source)
    first = FakeDevice(tmp_path / "first")
    deploy(first, bundle)
    assert hashed_apart == [] and streamed == [True] * len(SIZES)
    for f in bundle.files:
        assert bundle_mod.cached_digest(f.path, os.stat(f.path)) == f.sha256
    streamed.clear()
    second = FakeDevice(tmp_path / "second")
    deploy(second, bundle)
    assert hashed_apart == [] and streamed == [False] * len(SIZES)
    for dev in (first, second):
        ws = Path(bundle_workspace(dev, bundle))
        for f in bundle.files:
            assert _sha(ws / f.name) == f.sha256


def test_a_host_read_error_in_the_read_ahead_is_the_bundles_error(tmp_path, monkeypatch):
    """An I/O error while the reader thread reads ahead reaches the push as a UsageError naming the
    host file (bad input, not the device's fault), and the partial file goes."""
    bundle = make_bundle(tmp_path / "b", "eio", {"model.pte": 3 * MB})
    monkeypatch.setattr(bundle_mod, "_digest_cache", {})
    real_source = deploy_mod._Source

    class Failing:
        def __init__(self, raw):
            self.raw, self.reads = raw, 0

        def read(self, n):
            self.reads += 1
            if self.reads == 2:
                raise OSError(5, "Input/output error")
            return self.raw.read(n)

    monkeypatch.setattr(deploy_mod, "_Source", lambda raw, cancel, *, hashing: real_source(
        Failing(raw), cancel, hashing=hashing))
    device = FakeDevice(tmp_path / "device")
    with pytest.raises(UsageError, match=r"model\.pte: Input/output error"):
        deploy(device, bundle)
    ws = Path(bundle_workspace(device, bundle))
    assert not [p for p in ws.iterdir() if PARTIAL_SUFFIX in p.name] and not (ws / "model.pte").exists()


def test_on_progress_is_called_one_at_a_time_and_adds_up(tmp_path, monkeypatch):
    bundle = make_bundle(tmp_path / "b", "progress", SIZES)
    fake = CountingDevice(FakeDevice(tmp_path / "device"), delay=0.02)
    inside = threading.Lock()
    total: dict[str, int] = {}

    def on_progress(name, n):
        assert inside.acquire(blocking=False), "on_progress entered twice at once"
        try:
            total[name] = total.get(name, 0) + n
            time.sleep(0.0005)  # widen the window an overlap would need
        finally:
            inside.release()

    deploy(fake, bundle, on_progress=on_progress)
    assert fake.most > 1
    assert total == {n: s for n, s in SIZES.items() if s}
