"""The device layer against virtual devices behind a real adb server."""

from __future__ import annotations

import io
import os
import socket
import time

import pytest

from farm.config import AdbServerAddress
from farm.device.discovery import discover, find_device, scan_server
from farm.device.probe import Device, parse_battery, parse_df, parse_props, parse_thermal, split_sections
from farm.device.transport import client_for
from farm.errors import AdbError, DeviceGone, DeviceTimeout, InfraError, UsageError
from farm.virtual import VirtualDeviceSpec, VirtualFarm
from tests.support.devices import counting_sync_opens


@pytest.fixture(scope="module")
def farm4(tmp_path_factory):
    """Four SoCs at once, one of them reporting only ro.board.platform."""
    with VirtualFarm(home=tmp_path_factory.mktemp("devices-farm")) as vf:
        records = vf.up([VirtualDeviceSpec(soc="SM8450"), VirtualDeviceSpec(soc="SM8550", platform_only=True),
                         VirtualDeviceSpec(soc="SM8650"), VirtualDeviceSpec(soc="SM8750")])
        yield vf, records


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_discovery_reports_soc_htp_and_attributes(farm4):
    vf, records = farm4
    infos = {i.serial: i for i in discover([vf.adb_server])}
    assert set(infos) == {r.serial for r in records}
    by_soc = {i.soc: i for i in infos.values()}
    assert {soc: i.htp_arch for soc, i in by_soc.items()} == {
        "SM8450": "v69", "SM8550": "v73", "SM8650": "v75", "SM8750": "v79"}
    i = by_soc["SM8650"]
    assert (i.platform, i.model, i.android_release, i.sdk, i.abi) == (
        "pineapple", "SM-S928B", "14", 34, "arm64-v8a")
    assert i.virtual and i.state == "device" and i.server == str(vf.adb_server)
    record = next(r for r in records if r.serial == i.serial)
    assert i.workspace == str(record.workspace)  # a virtual device names its own workspace
    assert i.free_bytes and i.free_bytes > 0
    assert i.battery_level == 87 and i.battery_temp_c == pytest.approx(31.2)
    assert isinstance(i.thermal, dict)
    d = i.to_dict()
    assert d["soc"] == "SM8650" and d["htp_arch"] == "v75" and "thermal" in d


def test_platform_fallback_when_ro_soc_model_is_absent(farm4):
    vf, records = farm4
    record = next(r for r in records if r.soc == "SM8550")
    device = find_device([vf.adb_server], record.serial)
    assert "ro.soc.model" not in device.props() or not device.props()["ro.soc.model"]
    assert device.props()["ro.board.platform"] == "kalama"
    assert (device.soc, device.htp_arch) == ("SM8550", "v73")


def test_shell_v2_exit_codes_stderr_and_quoting(farm4):
    vf, records = farm4
    device = find_device([vf.adb_server], records[0].serial)
    r = device.shell("printf 'out'; printf 'err' >&2; exit 3", timeout=10)
    assert (r.exit_code, r.stdout, r.stderr) == (3, b"out", b"err")
    with pytest.raises(AdbError, match="exited 5: boom"):
        device.shell("echo boom >&2; exit 5", timeout=10, check=True)
    assert device.shell("cat", timeout=10).exit_code == 0  # stdin is closed, cat does not wait


def test_push_and_read_roundtrip(farm4):
    vf, records = farm4
    device = find_device([vf.adb_server], records[0].serial)
    payload = bytes(range(256)) * 1000 + b"tail"
    seen = []
    target = f"{device.workspace}/roundtrip/file with space.bin"
    assert device.push(io.BytesIO(payload), target, timeout=10, on_bytes=seen.append) == len(payload)
    assert sum(seen) == len(payload) and max(seen) <= 64 * 1024
    assert device.read_file(target) == payload
    with pytest.raises(AdbError, match="cannot read"):
        device.read_file(f"{device.workspace}/roundtrip/missing")


def test_keep_sync_carries_several_pushes_over_one_stream(farm4, monkeypatch):
    vf, records = farm4
    device = find_device([vf.adb_server], records[1].serial)
    opened = counting_sync_opens(device, monkeypatch)
    files = {f"{device.workspace}/kept/{name}": os.urandom(size)
             for name, size in (("a.bin", 300_000), ("b b.bin", 70_000), ("c.bin", 0))}
    with device.keep_sync():
        for remote, data in files.items():
            assert device.push(io.BytesIO(data), remote, timeout=10) == len(data)
        assert [device.read_file(remote) for remote in files] == list(files.values())
    assert opened == ["sync:"]
    # Outside the block every operation has its stream again, and nothing was left open.
    device.read_file(next(iter(files)))
    assert opened == ["sync:", "sync:"]


def test_keep_sync_drops_a_stream_after_a_failure_and_goes_on(farm4, monkeypatch):
    vf, records = farm4
    device = find_device([vf.adb_server], records[1].serial)
    opened = counting_sync_opens(device, monkeypatch)
    good = f"{device.workspace}/kept-fail/ok.bin"
    with device.keep_sync():
        device.push(io.BytesIO(b"one"), good, timeout=10)
        with pytest.raises(AdbError, match="cannot read"):
            device.read_file(f"{device.workspace}/kept-fail/missing")  # FAIL ends the session
        device.push(io.BytesIO(b"two"), good, timeout=10)
        assert device.read_file(good) == b"two"
    assert opened == ["sync:", "sync:"]


def test_keep_sync_notices_a_kept_stream_the_device_closed(tmp_path, monkeypatch):
    with VirtualFarm(home=tmp_path / "farm") as vf:
        (record,) = vf.up([VirtualDeviceSpec(soc="SM8650")])
        device = find_device([vf.adb_server], record.serial)
        opened = counting_sync_opens(device, monkeypatch)
        remote = f"{device.workspace}/kept-reboot/x.bin"
        with device.keep_sync():
            device.push(io.BytesIO(b"before"), remote, timeout=10)
            vf.reboot(record.serial)  # every stream of the device ends
            device.push(io.BytesIO(b"after"), remote, timeout=30)
            assert device.read_file(remote) == b"after"
        assert opened == ["sync:", "sync:"]


def test_timeout_kills_the_command_and_the_device_stays_usable(farm4):
    vf, records = farm4
    device = find_device([vf.adb_server], records[1].serial)
    with pytest.raises(DeviceTimeout, match="did not finish in 1 s"):
        device.shell(f"echo $$ > {device.workspace}/sleeper.pid; exec sleep 30", timeout=1)
    pid = device.shell(f"cat {device.workspace}/sleeper.pid", timeout=10).out.strip()
    # The sleeper was killed with its stream (the virtual device's adbd kills the process group).
    assert device.shell(f"for i in $(seq 50); do kill -0 {pid} 2>/dev/null || exit 0; sleep 0.1; "
                        "done; exit 1", timeout=15).exit_code == 0
    assert device.shell("echo ok", timeout=10).out == "ok\n"


def test_hung_command_fault_times_out(farm4):
    vf, records = farm4
    serial = records[2].serial
    device = find_device([vf.adb_server], serial)
    vf.set_faults(serial, hang_commands=r"^echo hang-me")
    try:
        with pytest.raises(DeviceTimeout):
            device.shell("echo hang-me", timeout=1)
    finally:
        vf.clear_faults(serial)
    assert device.shell("echo hang-me", timeout=10).out == "hang-me\n"


def test_unknown_serial_is_a_usage_error_naming_the_servers(farm4):
    vf, _ = farm4
    with pytest.raises(UsageError, match=f"NOPE not found on adb servers {vf.adb_server}"):
        find_device([vf.adb_server], "NOPE")


def test_unreachable_server_is_an_adb_error_naming_it_and_starts_nothing(farm4):
    vf, records = farm4
    dead = AdbServerAddress("127.0.0.1", _free_port())
    with pytest.raises(AdbError, match=f"adb server {dead} unreachable"):
        discover([vf.adb_server, dead])
    scans = [scan_server(vf.adb_server), scan_server(dead)]
    assert len(scans[0].devices) == len(records) and scans[0].error is None
    assert scans[1].devices == [] and str(dead) in scans[1].error
    with pytest.raises(AdbError, match=str(dead)):
        find_device([dead], records[0].serial)
    # adbutils would have started an adb server on its own; ours must not have.
    with socket.socket() as s:
        assert s.connect_ex((dead.host, dead.port)) != 0


def test_killed_device_is_gone_and_listed_offline(tmp_path):
    with VirtualFarm(home=tmp_path / "farm") as vf:
        (record,) = vf.up([VirtualDeviceSpec(soc="SM8650")])
        device = find_device([vf.adb_server], record.serial)
        device.props()
        vf.kill(record.serial)
        with pytest.raises(DeviceGone):
            device.shell("echo hi", timeout=10)
        with pytest.raises(InfraError):
            find_device([vf.adb_server], record.serial)
        (info,) = discover([vf.adb_server])
        assert info.state != "device" and info.soc is None and info.htp_arch is None


def test_device_object_reports_the_configured_workspace_on_a_real_device(farm4):
    vf, records = farm4
    device = Device(client_for(vf.adb_server), records[0].serial, vf.adb_server, workspace_root="/data/local/tmp/x")
    device._props = {"ro.soc.model": "SM8650"}  # what a phone reports: no ro.ptefarm.* properties
    assert device.workspace == "/data/local/tmp/x" and not device.is_virtual


def test_device_probe_parsers():
    out = "@@df\nFilesystem 1K-blocks Used Available Use% Mounted on\n/dev/block/very-long-name\n" \
          "  1000 10 990 1% /data\n@@battery\n  level: 85\n  temperature: 312\n@@thermal\n" \
          "thermal_zone0=cpu-0=45000\nthermal_zone1=cpu-0=47500\nthermal_zone2==38\nthermal_zone3=x=oops\n"
    sections = split_sections(out)
    assert parse_df(sections["df"]) == 990 * 1024  # a wrapped data line still parses
    assert parse_battery(sections["battery"]) == (85, 31.2)
    assert parse_thermal(sections["thermal"]) == {"cpu-0": 45.0, "cpu-0#1": 47.5, "thermal_zone2": 38.0}
    assert parse_df("") is None and parse_battery("") == (None, None)
    assert split_sections("@@stat\nname\u2028with-separator\n")["stat"] == "name\u2028with-separator\n"
    assert parse_props("ro.soc.model=SM8650 \nro.other=x\nnoise\nro.board.platform=pineapple") == {
        "ro.soc.model": "SM8650", "ro.board.platform": "pineapple"}


def test_adb_server_stopped_mid_command_is_an_infra_error(tmp_path):
    """The adb server is stopped (kill-server) while a command runs: an InfraError (never a bare
    adbutils exception), and later calls say the server does not answer instead of silently starting
    another one. (A server that crashes, SIGKILL, is tests/fixtures/test_blame.py's.)"""
    from concurrent.futures import ThreadPoolExecutor

    with VirtualFarm(home=tmp_path / "farm") as vf:
        (dev,) = vf.up([VirtualDeviceSpec(soc="SM8650")])
        device = find_device([vf.adb_server], dev.serial)
        with ThreadPoolExecutor(max_workers=1) as worker:
            running = worker.submit(device.shell, "sleep 20", timeout=60)
            time.sleep(1.0)
            vf.server.stop()
            error = running.exception(timeout=30)
        assert isinstance(error, InfraError), repr(error)
        with pytest.raises(AdbError, match=str(vf.adb_server.port)):
            discover([vf.adb_server])
        assert not vf.server.is_running()  # nothing restarted it behind our back
