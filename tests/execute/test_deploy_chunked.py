"""Chunked deploy on virtual devices: only what changed is pushed, the device's digest is the record's
truth, a damaged chunk store is repaired, the store is bounded without losing what a deployed file
needs, and a device without room gets whole files."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import pytest

from farm.bundle.manifest import Bundle, describe_file
from farm.device.discovery import find_device
from farm.errors import AdbError, InfraError, UsageError
from farm.execute import chunking, chunkstore
from farm.execute.chunking import PLAIN, ChunkPolicy
from farm.execute.chunkstore import STORE_DIR
from farm.execute.deploy import PARTIAL_SUFFIX, RECORD_NAME, bundle_workspace, deploy
from farm.virtual import VirtualDeviceSpec, VirtualFarm
from tests.support.devices import wait_for_sync_sessions_to_end
from tests.support.random_bundle import make_bundle

KiB, MiB = 1 << 10, 1 << 20
# Small chunks, so a few MiB are a few hundred of them.
POLICY = ChunkPolicy(min_file_bytes=1 * MiB, min_chunk=8 * KiB, avg_chunk=32 * KiB,
                     max_chunk=128 * KiB)


@pytest.fixture
def phone(tmp_path):
    with VirtualFarm(home=tmp_path / "farm") as vf:
        (rec,) = vf.up([VirtualDeviceSpec(soc="SM8650")])
        yield vf, rec, find_device([vf.adb_server], rec.serial)


def _host(vf, device, remote: str) -> Path:
    return vf.device(device.serial).host_path(remote)


def _store(vf, device) -> Path:
    return _host(vf, device, f"{device.workspace}/{STORE_DIR}")


def _chunks(vf, device) -> dict[str, Path]:
    """sha256 -> file of every chunk in the device's store (in its batch directories)."""
    return {p.name: p for p in _store(vf, device).rglob("*")
            if p.is_file() and len(p.name) == 64 and PARTIAL_SUFFIX not in str(p)}


def _partials(vf, device) -> list[Path]:
    return [p for p in _store(vf, device).rglob("*") if PARTIAL_SUFFIX in p.name]


def _rebuilt(bundle: Bundle, name: str, edit) -> Bundle:
    """``bundle`` with file ``name`` rewritten by ``edit(bytes) -> bytes`` (a rebuild), re-described."""
    f = next(f for f in bundle.files if f.name == name)
    f.path.write_bytes(edit(f.path.read_bytes()))
    files = [describe_file(f.path.parent, f.path, role=f.role, name=f.name) if g.name == name else g
             for g in bundle.files]
    return dataclasses.replace(bundle, files=files)


def _device_sha(device, path: str) -> str:
    return device.shell(f"sha256sum -- {path}", timeout=30, check=True).out.split()[0]


def _record(vf, device, bundle) -> dict:
    return json.loads(_host(vf, device, f"{bundle_workspace(device, bundle)}/{RECORD_NAME}")
                      .read_text())["files"]


def _insert(at: int, extra: bytes):
    return lambda data: data[:at] + extra + data[at:]


def test_a_rebuild_pushes_only_the_chunks_around_what_changed(phone, tmp_path):
    vf, rec, device = phone
    bundle = make_bundle(tmp_path / "b", "delta", {"model.pte": 6 * MiB, "tok.bin": 3000})
    first = deploy(device, bundle, chunking=POLICY)
    assert first.chunks["files"] == 1 and first.chunks["chunks_reused"] == 0
    assert first.bytes_pushed == 6 * MiB + 3000  # random bytes: every chunk is new

    # A rebuild: 100 bytes inserted (every later offset moves) and 4 KiB rewritten further on.
    def edit(data: bytes) -> bytes:
        data = _insert(2 * MiB, os.urandom(100))(data)
        return data[:4 * MiB] + os.urandom(4 * KiB) + data[4 * MiB + 4 * KiB:]
    rebuilt = _rebuilt(bundle, "model.pte", edit)
    second = deploy(device, rebuilt, chunking=POLICY)
    assert second.pushed == ["model.pte"]
    assert second.bytes_pushed < 0.05 * 6 * MiB, second.summary()  # two chunks or so, not 6 MiB
    assert second.chunks["chunks_pushed"] <= 6 and second.chunks["bytes_reused"] > 5.5 * MiB
    ws = bundle_workspace(device, rebuilt)
    model = next(f for f in rebuilt.files if f.name == "model.pte")
    assert _device_sha(device, f"{ws}/model.pte") == model.sha256
    assert _host(vf, device, f"{ws}/model.pte").read_bytes() == model.path.read_bytes()
    entry = _record(vf, device, rebuilt)["model.pte"]
    assert entry["sha256"] == model.sha256 and len(entry["chunks"]) > 100
    assert not [p for p in _host(vf, device, ws).iterdir() if PARTIAL_SUFFIX in p.name]
    assert not _partials(vf, device)
    # The record vouches for the assembled file: the next deploy pushes and hashes nothing.
    third = deploy(device, rebuilt, chunking=POLICY)
    assert third.files_pushed == 0 and third.files_hashed == 0


def test_the_second_program_of_a_bundle_reuses_the_first_ones_chunks(phone, tmp_path):
    vf, rec, device = phone
    bundle = make_bundle(tmp_path / "b", "two", {"kv.pte": 4 * MiB})
    deploy(device, bundle, chunking=POLICY)
    kv = bundle.files[0]
    hybrid = tmp_path / "b" / "hybrid.pte"  # the same weights behind another program header
    hybrid.write_bytes(os.urandom(64 * KiB) + kv.path.read_bytes())
    both = dataclasses.replace(bundle, files=[kv, describe_file(tmp_path / "b", hybrid, role="pte",
                                                                name="hybrid.pte")])
    report = deploy(device, both, chunking=POLICY)
    assert report.pushed == ["hybrid.pte"]
    assert report.bytes_pushed < 0.1 * hybrid.stat().st_size, report.summary()
    assert (_host(vf, device, f"{bundle_workspace(device, both)}/hybrid.pte").read_bytes()
            == hybrid.read_bytes())


def _chunk_of(vf, device, bundle, name: str, index: int) -> Path:
    sha = _record(vf, device, bundle)[name]["chunks"][index]
    return _chunks(vf, device)[sha]


def test_a_damaged_chunk_store_is_repaired_never_assembled_into_a_wrong_file(phone, tmp_path):
    vf, rec, device = phone
    bundle = make_bundle(tmp_path / "b", "damage", {"model.pte": 3 * MiB})
    deploy(device, bundle, chunking=POLICY)
    altered = _chunk_of(vf, device, bundle, "model.pte", 3)  # same size, other bytes: only a
    altered.write_bytes(bytes(b ^ 0xFF for b in altered.read_bytes()))  # digest can tell
    truncated = _chunk_of(vf, device, bundle, "model.pte", 7)
    truncated.write_bytes(truncated.read_bytes()[:100])
    removed = _chunk_of(vf, device, bundle, "model.pte", 11)
    removed.unlink()

    rebuilt = _rebuilt(bundle, "model.pte", _insert(2 * MiB, b"x" * 10))
    report = deploy(device, rebuilt, chunking=POLICY)
    assert report.chunks["chunks_repaired"] == 1, report.summary()
    model = rebuilt.files[0]
    ws = bundle_workspace(device, rebuilt)
    assert _device_sha(device, f"{ws}/model.pte") == model.sha256
    chunks = _chunks(vf, device)
    assert {altered.name, truncated.name, removed.name} <= set(chunks)  # all three are back
    files = [p for p in _store(vf, device).rglob("*") if p.is_file()]
    assert len(files) == len(chunks)  # one copy each: the damaged ones are gone, not shadowed
    for path in files:
        assert hashlib.sha256(path.read_bytes()).hexdigest() == path.name


def test_a_store_that_cannot_be_repaired_is_the_devices_fault_and_deploys_nothing(
        phone, tmp_path, monkeypatch):
    vf, rec, device = phone
    bundle = make_bundle(tmp_path / "b", "liar", {"model.pte": 2 * MiB})
    deploy(device, bundle, chunking=POLICY)
    altered = _chunk_of(vf, device, bundle, "model.pte", 2)
    altered.write_bytes(bytes(len(altered.read_bytes())))
    # A store whose chunks all hash right when asked, yet assemble wrong: nothing to repair.
    monkeypatch.setattr(chunkstore, "damaged", lambda *a, **k: set())
    rebuilt = _rebuilt(bundle, "model.pte", _insert(MiB, b"y"))
    with pytest.raises(AdbError, match=f"{rec.serial}: model.pte assembled .* expected "
                                       f"{rebuilt.files[0].sha256}") as caught:
        deploy(device, rebuilt, chunking=POLICY)
    assert isinstance(caught.value, InfraError) and not isinstance(caught.value, UsageError)
    ws = _host(vf, device, bundle_workspace(device, rebuilt))
    assert not [p for p in ws.iterdir() if PARTIAL_SUFFIX in p.name]
    # The file of the first deploy is still there, and its record still vouches for it alone.
    assert (ws / "model.pte").stat().st_size == 2 * MiB
    assert _record(vf, device, bundle)["model.pte"]["sha256"] == bundle.files[0].sha256


def test_the_store_is_bounded_but_keeps_every_chunk_a_deployed_file_lists(phone, tmp_path):
    vf, rec, device = phone
    a = make_bundle(tmp_path / "a", "app-a", {"model.pte": 2 * MiB})
    b = make_bundle(tmp_path / "b", "app-b", {"model.pte": 2 * MiB})
    deploy(device, a, chunking=POLICY)
    old = set(_record(vf, device, a)["model.pte"]["chunks"])
    a2 = _rebuilt(a, "model.pte", lambda data: os.urandom(MiB) + data[MiB:])  # half new
    deploy(device, a2, chunking=POLICY)
    tight = dataclasses.replace(POLICY, store_bytes=3 * MiB)
    report = deploy(device, b, chunking=tight)
    kept = set(_chunks(vf, device))
    needed = (set(_record(vf, device, a2)["model.pte"]["chunks"])
              | set(_record(vf, device, b)["model.pte"]["chunks"]))
    assert needed <= kept  # over the bound (4 MiB listed), yet nothing a deployed file lists is gone
    assert kept == needed  # and only a2's predecessor's chunks went (old, LRU, listed by nobody)
    assert report.chunks["chunks_evicted"] == len(old - needed) > 0


def test_a_device_without_room_for_chunks_gets_whole_files(tmp_path):
    bundle = make_bundle(tmp_path / "b", "roomy", {"model.pte": 3 * MiB})
    # Room for the file, not for the file and its chunks.
    with VirtualFarm(home=tmp_path / "farm") as vf:
        (rec,) = vf.up([VirtualDeviceSpec(soc="SM8650", free_bytes=4 * MiB)])
        device = find_device([vf.adb_server], rec.serial)
        report = deploy(device, bundle, chunking=POLICY)
        assert report.chunks["fallback"] and "pushed whole" in report.summary()
        assert report.bytes_pushed == 3 * MiB
        ws = bundle_workspace(device, bundle)
        assert _device_sha(device, f"{ws}/model.pte") == bundle.files[0].sha256


def test_an_interrupted_chunked_push_leaves_no_partial_and_the_next_deploy_completes(phone, tmp_path):
    vf, rec, device = phone
    bundle = make_bundle(tmp_path / "b", "cut", {"model.pte": 3 * MiB})
    vf.set_faults(rec.serial, drop_after_bytes=MiB)
    with pytest.raises(InfraError) as caught:
        deploy(device, bundle, chunking=POLICY, timeout=10)
    assert not isinstance(caught.value, UsageError)
    vf.clear_faults(rec.serial)
    vf.restart(rec.serial)
    device = find_device([vf.adb_server], rec.serial)
    ws = _host(vf, device, bundle_workspace(device, bundle))
    assert not (ws / "model.pte").exists() and not (ws / RECORD_NAME).exists()
    deploy(device, bundle, chunking=POLICY, timeout=10)
    assert (ws / "model.pte").read_bytes() == bundle.files[0].path.read_bytes()
    assert not _partials(vf, device)


def test_a_full_disk_mid_chunks_is_storage_full_and_keeps_the_chunks_that_arrived(phone, tmp_path):
    vf, rec, device = phone
    bundle = make_bundle(tmp_path / "b", "full", {"model.pte": 3 * MiB})
    # A virtual device's disk fills per file: the chunks above 40 KiB fail, the smaller ones arrive.
    vf.set_faults(rec.serial, disk_full_after_bytes=40 * KiB)
    with pytest.raises(AdbError, match=f"device {rec.serial}: storage full .*deploy needs") as caught:
        deploy(device, bundle, chunking=POLICY, timeout=10)
    assert not isinstance(caught.value, UsageError)
    ws = _host(vf, device, bundle_workspace(device, bundle))
    assert not [p for p in ws.iterdir() if p.name != "."]  # no file, no partial, no record
    # The device serves the sends it had queued after the client gave up on them (a send into the
    # renamed batch makes its directory again, adbd's mkdir of parents): no chunk of them stays
    # under a temporary name once its sessions end, and the next deploy removes what they left.
    wait_for_sync_sessions_to_end(vf, rec.serial)
    assert not [p for p in _partials(vf, device) if p.is_file()]
    vf.clear_faults(rec.serial)
    report = deploy(device, bundle, chunking=POLICY, timeout=10)
    assert (ws / "model.pte").read_bytes() == bundle.files[0].path.read_bytes()
    assert report.chunks["chunks_reused"] > 0  # what arrived before the disk filled is not pushed again
    assert not _partials(vf, device)


def test_a_corrupt_host_file_is_the_bundles_error_before_any_chunk_is_pushed(phone, tmp_path):
    vf, rec, device = phone
    bundle = make_bundle(tmp_path / "b", "bad", {"model.pte": 2 * MiB})
    path = bundle.files[0].path
    data = bytearray(path.read_bytes())
    data[MiB] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(UsageError, match=f"{path}.*sha256 .*manifest says .*{bundle.files[0].sha256}"):
        deploy(device, bundle, chunking=POLICY)
    assert not _store(vf, device).exists() or not list(_store(vf, device).rglob("*"))


def test_plain_policy_and_the_environment(monkeypatch):
    assert not PLAIN.chunks(10 * MiB)
    monkeypatch.setenv(chunking.MIN_BYTES_ENV, "off")
    assert ChunkPolicy.from_env().min_file_bytes is None
    monkeypatch.setenv(chunking.MIN_BYTES_ENV, "4096")
    assert ChunkPolicy.from_env().chunks(4096) and not ChunkPolicy.from_env().chunks(4095)
    monkeypatch.setenv(chunking.MIN_BYTES_ENV, "lots")
    with pytest.raises(UsageError, match=f"{chunking.MIN_BYTES_ENV}='lots'"):
        ChunkPolicy.from_env()


class _Lease:
    """What FencedDevice needs of a lease: its token, and a clock that still trusts it."""

    def __init__(self, token: str):
        self.token = token

    def check(self) -> None:
        pass


def test_a_superseded_holder_puts_no_chunk_in_the_store(phone, tmp_path, monkeypatch):
    """A holder that lost the device between its chunk pushes and their rename: the rename is a
    fenced command, refused; its chunks stay under the temporary name the next deploy removes."""
    from farm.device.fence import FencedDevice
    from farm.errors import LeaseLost

    vf, rec, device = phone
    bundle = make_bundle(tmp_path / "b", "fenced", {"model.pte": 2 * MiB})
    old = FencedDevice(device, _Lease("old" * 8))
    old.claim()
    rename = chunkstore._rename_batch

    def taken_over_first(*args, **kwargs):
        FencedDevice(device, _Lease("new" * 8)).claim()  # another lease claims the device now
        return rename(*args, **kwargs)

    monkeypatch.setattr(chunkstore, "_rename_batch", taken_over_first)
    with pytest.raises(LeaseLost):
        deploy(old, bundle, chunking=POLICY)
    monkeypatch.setattr(chunkstore, "_rename_batch", rename)
    assert not _chunks(vf, device) and _partials(vf, device)  # pushed, but not under a real name
    ws = _host(vf, device, bundle_workspace(device, bundle))
    assert not (ws / "model.pte").exists() and not (ws / RECORD_NAME).exists()

    report = deploy(FencedDevice(device, _Lease("new" * 8)), bundle, chunking=POLICY)
    assert report.pushed == ["model.pte"] and not _partials(vf, device)
    assert (ws / "model.pte").read_bytes() == bundle.files[0].path.read_bytes()
