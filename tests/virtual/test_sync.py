"""The sync service of virtual devices, driven by adbutils and by the real adb client binary."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from pathlib import Path

import adbutils
import pytest

from farm.device.adb_server import adb_binary


@pytest.fixture
def dev(shared_virtual_farm):
    return shared_virtual_farm.devices[0]


@pytest.fixture
def device(shared_virtual_farm, dev):
    return shared_virtual_farm.client().device(dev.serial)


def _sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def _remote(dev, *parts: str) -> tuple[str, Path]:
    """A path in the device's workspace: as the device names it, and where it is on the host."""
    remote = "/".join([dev.workspace, *parts])
    return remote, dev.host_path(remote)


def test_push_pull_round_trip(device, dev, tmp_path):
    src = tmp_path / "model.pte"
    src.write_bytes(os.urandom(6 * 1024 * 1024 + 123))
    remote, host = _remote(dev, "rt", "nested", "model.pte")  # parent dirs are created
    device.sync.push(src, remote, mode=0o640)
    assert _sha(host) == _sha(src)
    assert stat.S_IMODE(host.stat().st_mode) == 0o640
    back = tmp_path / "back.pte"
    device.sync.pull(remote, back)
    assert _sha(back) == _sha(src)
    assert not [p for p in host.parent.iterdir() if p.name != "model.pte"]  # no temp files


def test_adb_cli_push_pull(shared_virtual_farm, dev, tmp_path):
    src = tmp_path / "blob.bin"
    src.write_bytes(os.urandom(3 * 1024 * 1024))
    remote, host = _remote(dev, "cli", "blob.bin")
    base = [adb_binary(), "-P", str(shared_virtual_farm.adb_server.port), "-s", dev.serial]
    env = shared_virtual_farm.server.env()
    subprocess.run([*base, "push", str(src), remote], check=True, env=env,
                   capture_output=True, timeout=60)
    subprocess.run([*base, "pull", remote, str(tmp_path / "back.bin")], check=True, env=env,
                   capture_output=True, timeout=60)
    assert _sha(tmp_path / "back.bin") == _sha(src) == _sha(host)
    ls = subprocess.run([*base, "shell", "ls", remote.rsplit("/", 1)[0]], check=True, env=env,
                        capture_output=True, text=True, timeout=60)
    assert ls.stdout.split() == ["blob.bin"]


def test_listing_and_stat(device, dev):
    remote, d = _remote(dev, "listing")
    d.mkdir(exist_ok=True)
    (d / "a.txt").write_bytes(b"12345")
    (d / "sub").mkdir(exist_ok=True)
    entries = {f.path: f for f in device.sync.list(remote)}
    assert set(entries) == {"a.txt", "sub"}
    assert entries["a.txt"].size == 5
    assert entries["sub"].mode & stat.S_IFDIR
    assert device.sync.stat(remote + "/a.txt").size == 5


def test_stat_of_missing_file(device, dev):
    missing, _ = _remote(dev, "does-not-exist")
    info = device.sync.stat(missing)
    assert info.mode == 0 and info.size == 0 and info.mtime is None
    assert not device.sync.exists(missing)


def test_pull_of_missing_file_fails(device, dev):
    with pytest.raises(adbutils.AdbError, match="No such file"):
        device.sync.read_bytes(_remote(dev, "missing.bin")[0])


@pytest.mark.parametrize("where", ["/etc/ptefarm-escape.bin", "/system/bin/ptefarm-escape",
                                   "/data/local/tmp/../../../usr/ptefarm-escape.bin"])
def test_push_outside_storage_is_refused(shared_virtual_farm, device, dev, where, tmp_path):
    """Inside its view a device's / is read-only: only /data (and a private /tmp) take files."""
    with pytest.raises(adbutils.AdbError, match="FAIL"):  # adbutils drops the message
        device.sync.push(b"nope", where)
    src = tmp_path / "x.bin"
    src.write_bytes(b"nope")
    cli = subprocess.run([adb_binary(), "-P", str(shared_virtual_farm.adb_server.port), "-s",
                          dev.serial, "push", str(src), where],
                         env=shared_virtual_farm.server.env(), capture_output=True, text=True,
                         timeout=60, check=False)
    assert cli.returncode != 0
    assert "read-only file system" in (cli.stderr + cli.stdout).lower()
    for host in (os.path.normpath(where), "/etc/ptefarm-escape.bin", "/usr/ptefarm-escape.bin"):
        assert not os.path.exists(host)


def test_host_paths_do_not_exist_inside(device, dev):
    """The device root's host path means nothing inside the view; a push there lands in the view's
    private /tmp at most, never on the host."""
    target = f"{dev.root}/../escape.bin"
    try:
        device.sync.push(b"nope", target)
    except adbutils.AdbError:
        pass  # refused is fine too
    assert not os.path.exists(os.path.normpath(target))


def test_pull_of_host_files_finds_nothing(device):
    with pytest.raises(adbutils.AdbError, match="No such file"):
        device.sync.read_bytes("/etc/hostname")  # the host's: not in the view
    assert b"ro.soc.model=" in device.sync.read_bytes("/system/build.prop")  # the device's


def test_symlink_out_of_the_device_stays_inside(device, dev, tmp_path):
    """A symlink in the storage to a host path resolves inside the view: it cannot lead out."""
    _, link = _remote(dev, "link-out")
    link.unlink(missing_ok=True)
    link.symlink_to(tmp_path)
    try:
        device.sync.push(b"nope", dev.workspace + "/link-out/f.bin")
    except adbutils.AdbError:
        pass
    assert not (tmp_path / "f.bin").exists()
    assert list(tmp_path.iterdir()) == []


def test_adb_cli_pull_directory(shared_virtual_farm, dev, tmp_path):
    """`adb pull DIR` walks it with LIS2/LST2 (ls_v2, stat_v2)."""
    remote, tree = _remote(dev, "tree")
    (tree / "sub").mkdir(parents=True, exist_ok=True)
    (tree / "a.bin").write_bytes(b"A" * 1000)
    (tree / "sub" / "b.bin").write_bytes(os.urandom(70_000))
    subprocess.run([adb_binary(), "-P", str(shared_virtual_farm.adb_server.port), "-s", dev.serial,
                    "pull", remote, str(tmp_path)], check=True, capture_output=True,
                   env=shared_virtual_farm.server.env(), timeout=60)
    assert (tmp_path / "tree" / "a.bin").read_bytes() == b"A" * 1000
    assert (tmp_path / "tree" / "sub" / "b.bin").read_bytes() == (tree / "sub" / "b.bin").read_bytes()
