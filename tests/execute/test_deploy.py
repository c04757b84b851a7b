"""Cached deployment to virtual devices: what is pushed, what is skipped, what is refused."""

from __future__ import annotations

import json
import os
import posixpath
from dataclasses import replace
from pathlib import Path

import pytest

from farm.bundle import manifest as bundle_mod
from farm.device.discovery import find_device
from farm.errors import AdbError, InfraError, UsageError
from farm.execute.deploy import PARTIAL_SUFFIX, RECORD_NAME, bundle_workspace, deploy
from farm.virtual import VirtualDeviceSpec, VirtualFarm
from tests.support.devices import counting_sync_opens, make_qnn_bundle

# Every deploy here runs with whole-file pushes and again with chunked deploy on.
pytestmark = pytest.mark.usefixtures("deploy_mode")



@pytest.fixture(scope="module")
def farm2(tmp_path_factory, deploy_mode):
    with VirtualFarm(home=tmp_path_factory.mktemp("deploy-farm")) as vf:
        records = vf.up([VirtualDeviceSpec(soc="SM8550"), VirtualDeviceSpec(soc="SM8650")])
        yield vf, {r.soc: r for r in records}


def _device(vf, record):
    return find_device([vf.adb_server], record.serial)


def _ws(vf, device, bundle) -> Path:
    """The bundle's workspace on the host: where the virtual device keeps its /data/... path."""
    return vf.device(device.serial).host_path(bundle_workspace(device, bundle))


def test_first_deploy_pushes_second_pushes_nothing(farm2, tmp_path, monkeypatch):
    vf, recs = farm2
    bundle = bundle_mod.load(make_qnn_bundle(tmp_path / "b", name="cache-test"))
    device = _device(vf, recs["SM8650"])
    pushed_to: list[str] = []
    real_push = device.push

    def recording_push(src, remote, *args, **kwargs):
        pushed_to.append(remote)
        return real_push(src, remote, *args, **kwargs)

    monkeypatch.setattr(device, "push", recording_push)
    first = deploy(device, bundle)
    wanted = bundle.files_for("v75")
    assert first.files_pushed == len(wanted) and first.files_skipped == 0
    assert first.bytes_pushed == sum(f.size for f in wanted)
    ws = _ws(vf, device, bundle)
    for f in wanted:
        assert (ws / f.name).read_bytes() == f.path.read_bytes()
    assert os.access(ws / "qnn_llama_runner", os.X_OK)
    # Every file (and the deploy record) went to a partial name first and was renamed into place.
    assert sorted(posixpath.basename(r) for r in pushed_to) == \
        sorted(name + PARTIAL_SUFFIX for name in [*(f.name for f in wanted), RECORD_NAME])
    assert not list(ws.glob("*" + PARTIAL_SUFFIX))
    record = json.loads((ws / RECORD_NAME).read_text())["files"]
    assert {n: e["sha256"] for n, e in record.items()} == {f.name: f.sha256 for f in wanted}

    second = deploy(device, bundle)
    assert (second.files_pushed, second.bytes_pushed, second.files_skipped) == (0, 0, len(wanted))
    assert second.files_hashed == 0  # the record was trusted: nothing re-read on the device


def test_first_deploy_reuses_its_sync_streams(farm2, tmp_path, monkeypatch):
    """A deploy opens at most one sync stream per push in flight (files and record share them), not
    one per file: each new stream costs the device a sync service."""
    from farm.execute.deploy import IN_FLIGHT

    vf, recs = farm2
    bundle = bundle_mod.load(make_qnn_bundle(tmp_path / "b", name="stream-reuse"))
    device = _device(vf, recs["SM8550"])
    device.props()
    opened = counting_sync_opens(device, monkeypatch)
    report = deploy(device, bundle)
    assert report.files_pushed >= IN_FLIGHT + 1  # more files than streams: reuse is observable
    assert 1 <= len(opened) <= IN_FLIGHT
    assert device._sync_idle == []  # closed when the deploy ended


def test_file_altered_on_device_is_pushed_again(farm2, tmp_path):
    vf, recs = farm2
    bundle = bundle_mod.load(make_qnn_bundle(tmp_path / "b", name="alter-test"))
    device = _device(vf, recs["SM8650"])
    deploy(device, bundle)
    ws = _ws(vf, device, bundle)
    pte = ws / "kv.pte"
    original = pte.read_bytes()
    pte.write_bytes(original[:-1] + b"X")  # same size, new content (and a new mtime)
    (ws / "tokenizer.model").write_bytes(b"shorter")  # size differs: pushed without hashing
    report = deploy(device, bundle)
    assert sorted(report.pushed) == ["kv.pte", "tokenizer.model"]
    assert report.files_hashed == 1  # only the same-size file needed the device's sha256sum
    assert pte.read_bytes() == original
    assert (ws / "tokenizer.model").read_bytes() == b"tok"

    # A change that restores size and mtime fools the fast check; the full check catches it.
    st = pte.stat()
    pte.write_bytes(original[:-1] + b"Y")
    os.utime(pte, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert deploy(device, bundle).files_pushed == 0
    full = deploy(device, bundle, verify="full")
    assert full.pushed == ["kv.pte"] and full.files_hashed == len(bundle.files_for("v75"))
    assert pte.read_bytes() == original


def test_lost_record_costs_hashing_not_pushing(farm2, tmp_path):
    vf, recs = farm2
    bundle = bundle_mod.load(make_qnn_bundle(tmp_path / "b", name="record-test"))
    device = _device(vf, recs["SM8550"])
    deploy(device, bundle)
    (_ws(vf, device, bundle) / RECORD_NAME).write_text("{not json")
    report = deploy(device, bundle)
    assert report.files_pushed == 0 and report.files_hashed == len(bundle.files_for("v73"))
    assert deploy(device, bundle).files_hashed == 0  # the record was rewritten


def test_qnn_libraries_follow_the_htp_arch(farm2, tmp_path):
    vf, recs = farm2
    bundle = bundle_mod.load(make_qnn_bundle(tmp_path / "b", name="arch-test"))
    for soc, arch, other in (("SM8550", "v73", "v75"), ("SM8650", "v75", "v73")):
        device = _device(vf, recs[soc])
        deploy(device, bundle)
        ws = _ws(vf, device, bundle)
        assert (ws / f"libQnnHtpV{arch[1:]}Stub.so").read_text() == f"stub {arch}"
        assert (ws / "libQnnHtp.so").read_text() == f"htp {arch}"
        assert not (ws / f"libQnnHtpV{other[1:]}Stub.so").exists()


def test_device_of_an_arch_the_bundle_lacks_is_refused(farm2, tmp_path):
    vf, recs = farm2
    bundle = bundle_mod.load(make_qnn_bundle(tmp_path / "b", name="v79-only", archs=("v79",)))
    device = _device(vf, recs["SM8650"])
    with pytest.raises(UsageError, match=r"QNN libraries for v79 only; device .* \(SM8650\) is v75"):
        deploy(device, bundle)
    assert not _ws(vf, device, bundle).exists()


@pytest.mark.parametrize("bad_name", ["../escape.pte", "/etc/evil", "a/../../b"])
def test_names_escaping_the_workspace_are_refused_before_any_push(farm2, tmp_path, bad_name):
    vf, recs = farm2
    bundle = bundle_mod.load(make_qnn_bundle(tmp_path / "b", name="traversal-test"))
    evil = replace(bundle.files[-1], name=bad_name, htp_arch=None)
    bundle.files.append(evil)  # bundle.load refuses this; deploy checks again
    device = _device(vf, recs["SM8650"])
    with pytest.raises(UsageError, match="escapes the workspace|is absolute"):
        deploy(device, bundle)
    assert not _ws(vf, device, bundle).exists()


def test_bundle_name_must_be_one_component(farm2, tmp_path):
    vf, recs = farm2
    bundle = bundle_mod.load(make_qnn_bundle(tmp_path / "b", name="fine"))
    bundle.name = "../up"
    with pytest.raises(UsageError, match="bundle name"):
        deploy(_device(vf, recs["SM8650"]), bundle)


def test_dropped_connection_mid_push_is_infra_and_leaves_no_half_file(tmp_path):
    bundle = bundle_mod.load(make_qnn_bundle(tmp_path / "b", name="drop-test", pte_bytes=400_000))
    with VirtualFarm(home=tmp_path / "farm") as vf:
        (record,) = vf.up([VirtualDeviceSpec(soc="SM8650")])
        device = find_device([vf.adb_server], record.serial)
        device.props()
        vf.set_faults(record.serial, drop_after_bytes=100_000)
        with pytest.raises(InfraError) as caught:
            deploy(device, bundle, timeout=10)
        assert not isinstance(caught.value, UsageError)
        ws = _ws(vf, device, bundle)
        assert not (ws / "kv.pte").exists() and not (ws / "hybrid.pte").exists()

        vf.clear_faults(record.serial)
        vf.restart(record.serial)
        device = find_device([vf.adb_server], record.serial)
        report = deploy(device, bundle, timeout=10)
        assert report.files_pushed == len(bundle.files_for("v75"))
        assert (ws / "kv.pte").read_bytes() == (tmp_path / "b" / "kv.pte").read_bytes()
        assert not list(ws.glob("*" + PARTIAL_SUFFIX))  # leftovers of the broken deploy are gone


def test_full_disk_is_an_adb_error_naming_the_device(tmp_path):
    bundle = bundle_mod.load(make_qnn_bundle(tmp_path / "b", name="full-test", pte_bytes=300_000))
    with VirtualFarm(home=tmp_path / "farm") as vf:
        (record,) = vf.up([VirtualDeviceSpec(soc="SM8650")])
        device = find_device([vf.adb_server], record.serial)
        vf.set_faults(record.serial, disk_full_after_bytes=50_000)
        with pytest.raises(AdbError, match=f"{record.serial}.*(No space|space)"):
            deploy(device, bundle, timeout=10)
        assert not (_ws(vf, device, bundle) / "kv.pte").exists()


def test_too_little_free_space_is_refused_before_pushing(tmp_path):
    bundle = bundle_mod.load(make_qnn_bundle(tmp_path / "b", name="df-test", pte_bytes=300_000))
    with VirtualFarm(home=tmp_path / "farm") as vf:
        (record,) = vf.up([VirtualDeviceSpec(soc="SM8650", free_bytes=100_000)])
        device = find_device([vf.adb_server], record.serial)
        with pytest.raises(AdbError, match="bytes free, deploy needs"):
            deploy(device, bundle, timeout=10)
