"""The deploy cache never vouches for bytes the device does not hold (FakeDevice: no adb).

A deploy skips a file only when it knows the device holds the manifest's bytes, and records only
digests of bytes it knows were sent. Each shortcut it takes must fall back to hashing, pushing or
refusing whenever it cannot know:

- the device-side record: a new build of a file with the same size replaces the deployed one, and the
  run after the deploy uses the new model, not the old one under the new one's name;
- a device file as new as the record itself ("racily clean": changed in the second the record was
  written, which a 1-second mtime cannot show) is hashed, not trusted;
- the digest a verify took, or the hash of the bytes as they are streamed: a host file rewritten
  after its verify, before or during its push is refused, not recorded, also on a filesystem whose
  times tick once a second;
- a push that ends short without an error is not recorded as deployed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import posixpath
import shutil
import threading
import time
from pathlib import Path

import pytest

from farm.bundle import manifest as bundle_mod
from farm.bundle.manifest import Bundle, describe_file
from farm.errors import FarmError, UsageError
from farm.execute import deploy as deploy_mod
from farm.execute.deploy import PARTIAL_SUFFIX, RECORD_NAME, bundle_workspace, deploy
from farm.execute.run import run
from farm.execute.runprofile import RunRequest
from tests.support.devices import make_qnn_bundle
from tests.support.fake_device import CHUNK, FakeDevice
from tests.support.hostfs import coarse_timestamps, same_tick, start_of_a_second
from tests.support.random_bundle import make_bundle


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _ws(device: FakeDevice, bundle: Bundle) -> Path:
    return Path(bundle_workspace(device, bundle))


def _record(device: FakeDevice, bundle: Bundle) -> dict:
    path = _ws(device, bundle) / RECORD_NAME
    return json.loads(path.read_text())["files"] if path.exists() else {}




def _nothing_claims(device: FakeDevice, bundle: Bundle, name: str, bad: bytes) -> None:
    """After a refused deploy: ``name`` is neither on the device under its real name with the bad
    bytes nor vouched for by a record, and no partial file is left."""
    ws = _ws(device, bundle)
    target = ws / name
    assert not (target.exists() and target.read_bytes() == bad), f"{name}: the refused bytes were deployed"
    assert name not in _record(device, bundle)
    assert not [p for p in ws.iterdir() if PARTIAL_SUFFIX in p.name]


class HookedDevice(FakeDevice):
    """A FakeDevice that calls ``before_push(name)`` as each push begins (the workspace name, the
    record's included), on the pushing thread, before it reads a byte of the source."""

    def __init__(self, root: Path, before_push, **kwargs):
        super().__init__(root, **kwargs)
        self.before_push = before_push

    def push(self, src, remote, **kwargs):
        self.before_push(posixpath.basename(remote).removesuffix(PARTIAL_SUFFIX))
        return super().push(src, remote, **kwargs)


@pytest.fixture(params=["digest of a verify", "hashed as streamed"])
def digest_path(request, monkeypatch):
    """Both ways a pushed file's digest is taken: the one a verify in this process took (RACY_NS 0:
    every file is settled, so the digests make_bundle takes stay cached, as a verify leaves them), or
    the bytes hashed as they are streamed (nothing cached)."""
    monkeypatch.setattr(bundle_mod, "_digest_cache", {})
    monkeypatch.setattr(bundle_mod, "RACY_NS", 0 if request.param == "digest of a verify" else 10**18)
    return request.param


# -- the device-side record --------------------------------------------------------------------------


def test_a_new_build_of_the_same_size_replaces_the_deployed_one_and_is_what_runs(tmp_path):
    root = tmp_path / "bundle"
    manifest = make_qnn_bundle(root, name="rebuilt")
    device = FakeDevice(tmp_path / "device")
    old_bundle = bundle_mod.load(manifest, verify=True)
    deploy(device, old_bundle)
    ws = _ws(device, old_bundle)
    old = (root / "kv.pte").read_bytes()
    assert (ws / "kv.pte").read_bytes() == old

    new = b"kv-model " + b"n" * (len(old) - len(b"kv-model "))  # the next build: same size
    assert len(new) == len(old) and new != old
    (root / "kv.pte").write_bytes(new)
    files = [describe_file(root, f.path, role=f.role, name=f.name, htp_arch=f.htp_arch)
             if f.name == "kv.pte" else f for f in old_bundle.files]
    dataclasses.replace(old_bundle, files=files).write(manifest)
    bundle = bundle_mod.load(manifest, verify=True)

    device.pushes.clear()
    report = deploy(device, bundle)
    assert report.pushed == ["kv.pte"] and report.files_pushed == 1
    assert (ws / "kv.pte").read_bytes() == new
    assert _record(device, bundle)["kv.pte"]["sha256"] == _sha(new)
    result = run(device, bundle, RunRequest(prompts=["hi"], mode="kv"), timeout=60)
    assert json.loads(result.text)["model"] == new.decode()  # the runner loaded the new model

    again = deploy(device, bundle)  # and now the record is right: nothing to do
    assert (again.files_pushed, again.files_hashed) == (0, 0)


def test_a_device_file_as_new_as_the_record_is_hashed_not_trusted(tmp_path):
    """The device's ``stat`` gives mtimes in whole seconds. A file changed in the same second the
    record was written keeps the recorded mtime, so only a file strictly older than the record can be
    trusted on its size and mtime; one as new as the record is hashed."""
    bundle = bundle_mod.load(make_qnn_bundle(tmp_path / "bundle", name="racy"))
    device = FakeDevice(tmp_path / "device")
    ws = _ws(device, bundle)
    ws.mkdir(parents=True)
    second = int(time.time()) - 60
    wanted = bundle.files_for(device.htp_arch)
    for f in wanted:  # the files were put there by hand, in one second ...
        shutil.copyfile(f.path, ws / f.name)
        os.utime(ws / f.name, (second, second))
    first = deploy(device, bundle)  # ... no record: every file is hashed, found right, recorded
    assert first.files_pushed == 0 and first.files_hashed == len(wanted)
    os.utime(ws / RECORD_NAME, (second, second))  # ... and the deploy ran within that same second

    target = ws / "kv.pte"
    original = target.read_bytes()
    target.write_bytes(b"Q" * len(original))  # changed within that second too: same size ...
    os.utime(target, (second, second))  # ... and, at a 1-second resolution, the same mtime

    device.pushes.clear()
    report = deploy(device, bundle)  # verify="fast"
    assert "kv.pte" in device.hashed()
    assert report.pushed == ["kv.pte"]
    assert target.read_bytes() == original
    assert _record(device, bundle)["kv.pte"]["sha256"] == _sha(original)


# -- host files that change under the deploy -------------------------------------------------------


@pytest.mark.parametrize("keep_mtime", [False, True], ids=["new mtime", "mtime restored"])
@pytest.mark.parametrize("when", ["after the verify", "while it waits for a push slot"])
def test_a_host_file_rewritten_after_its_verify_is_refused(tmp_path, monkeypatch, when, keep_mtime):
    """A verify in this process hashed every file and the pushes take those digests instead of
    hashing again: a build that rewrites a small library after the verify (before the deploy, or
    while the three big pushes hold every slot) must not get its new bytes deployed under the digest
    of the old ones; also when the writer restores the mtime (as ``cp -p``, tar or ``rsync --inplace
    -t`` do), which leaves only the ctime to tell."""
    monkeypatch.setattr(bundle_mod, "RACY_NS", 0)  # every file settled: its verify digest is cached
    sizes = {"model.pte": 600_000, "libA.so": 500_000, "libB.so": 400_000, "libsmall.so": 5_000}
    bundle = make_bundle(tmp_path / "b", "between", sizes)
    bundle_mod.verify_bundle(bundle)
    small = tmp_path / "b" / "libsmall.so"
    assert bundle_mod.cached_digest(small.resolve(), os.stat(small)) is not None
    rewritten = os.urandom(sizes["libsmall.so"])
    changed = threading.Event()
    lock = threading.Lock()

    def rewrite():  # same size, other bytes, same inode
        st = os.stat(small)
        small.write_bytes(rewritten)
        if keep_mtime:
            os.utime(small, ns=(st.st_atime_ns, st.st_mtime_ns))
        changed.set()

    if when == "after the verify":
        rewrite()

    def before_push(name):
        if name in ("libsmall.so", RECORD_NAME):
            return
        with lock:  # the three big pushes hold every slot until the library is rewritten
            if not changed.is_set():
                time.sleep(0.1)
                rewrite()

    device = HookedDevice(tmp_path / "device", before_push)
    with pytest.raises(UsageError, match="libsmall.so changed"):
        deploy(device, bundle)
    assert changed.is_set()
    _nothing_claims(device, bundle, "libsmall.so", rewritten)


def test_a_host_file_rewritten_as_its_push_begins_is_refused(tmp_path, digest_path):
    bundle = make_bundle(tmp_path / "b", "begins", {"model.pte": 300_000})
    host = tmp_path / "b" / "model.pte"
    rewritten = os.urandom(300_000)

    def before_push(name):
        if name == "model.pte":
            time.sleep(0.2)  # the push has begun: it holds the identity it started with
            host.write_bytes(rewritten)

    device = HookedDevice(tmp_path / "device", before_push)
    with pytest.raises(UsageError, match="model.pte changed"):
        deploy(device, bundle)
    _nothing_claims(device, bundle, "model.pte", rewritten)


def test_a_host_file_rewritten_mid_push_is_refused(tmp_path, digest_path):
    size = 16 * CHUNK
    bundle = make_bundle(tmp_path / "b", "midway", {"model.pte": size})
    host = tmp_path / "b" / "model.pte"
    rewritten = os.urandom(size)
    changed = threading.Event()

    def change_once(name, n):  # after the first block went out
        if not changed.is_set():
            changed.set()
            host.write_bytes(rewritten)

    device = HookedDevice(tmp_path / "device", lambda name: time.sleep(0.2))  # hash done first
    with pytest.raises(UsageError, match="model.pte changed"):
        deploy(device, bundle, on_progress=change_once)
    assert changed.is_set()
    _nothing_claims(device, bundle, "model.pte", rewritten)


def test_a_fresh_host_file_rewritten_unseen_by_its_timestamps_is_refused(tmp_path, monkeypatch):
    """On a filesystem with 1-second times, a file rewritten within the second of its last write keeps
    its size, times and inode: nothing but its bytes tells. A host file changed less than ``RACY_NS``
    ago is therefore hashed as it is streamed, never trusted to be what a verify hashed."""
    coarse_timestamps(monkeypatch, tmp_path)
    for attempt in range(5):  # until the rewrite lands in the same second as the first write
        root = tmp_path / f"attempt-{attempt}"
        start_of_a_second()
        bundle = make_bundle(root / "b", f"coarse-{attempt}", {"model.pte": 200_000})
        host = root / "b" / "model.pte"
        written = os.lstat(host).st_ctime_ns  # lstat: the real, fine-grained times
        rewritten = os.urandom(200_000)
        stamps: list[int] = []

        def before_push(name, host=host, rewritten=rewritten, stamps=stamps):
            if name == "model.pte":
                time.sleep(0.05)  # the push has begun, not yet read a byte
                host.write_bytes(rewritten)
                stamps.append(os.lstat(host).st_ctime_ns)

        device = HookedDevice(root / "device", before_push)
        with pytest.raises(UsageError, match="model.pte changed"):
            deploy(device, bundle)
        _nothing_claims(device, bundle, "model.pte", rewritten)
        assert stamps, "the push never began"
        if same_tick(written, *stamps):
            return
    pytest.skip("the rewrite never landed in the second of the first write (machine too slow)")


def test_a_push_that_ends_short_is_not_recorded_as_deployed(tmp_path, digest_path):
    """A device whose push returns normally after the first block: the deploy must not take the
    partial file for the manifest's."""

    class _FirstBlockOnly:
        def __init__(self, src):
            self.src, self.left = src, CHUNK

        def readinto(self, buf):
            if self.left <= 0:
                return 0
            n = self.src.readinto(memoryview(buf)[:self.left])
            self.left -= n
            return n

    class ShortPushDevice(FakeDevice):
        def push(self, src, remote, **kwargs):
            if RECORD_NAME not in remote:
                src = _FirstBlockOnly(src)
            return super().push(src, remote, **kwargs)

    bundle = make_bundle(tmp_path / "b", "short", {"model.pte": 8 * CHUNK})
    device = ShortPushDevice(tmp_path / "device")
    with pytest.raises(FarmError):
        deploy(device, bundle)
    ws = _ws(device, bundle)
    assert not (ws / "model.pte").exists() and "model.pte" not in _record(device, bundle)
    assert not [p for p in ws.iterdir() if PARTIAL_SUFFIX in p.name]
