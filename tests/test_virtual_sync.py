"""The sync service of virtual devices, driven by adbutils and by the real adb client binary."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess

import adbutils
import pytest

from farm.adb_server import adb_binary


@pytest.fixture
def dev(shared_virtual_farm):
    return shared_virtual_farm.devices[0]


@pytest.fixture
def device(shared_virtual_farm, dev):
    return shared_virtual_farm.client().device(dev.serial)


def _sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_push_pull_round_trip(device, dev, tmp_path):
    src = tmp_path / "model.pte"
    src.write_bytes(os.urandom(6 * 1024 * 1024 + 123))
    remote = dev.workspace / "rt" / "nested" / "model.pte"  # parent dirs are created
    device.sync.push(src, str(remote), mode=0o640)
    assert _sha(remote) == _sha(src)
    assert stat.S_IMODE(remote.stat().st_mode) == 0o640
    back = tmp_path / "back.pte"
    device.sync.pull(str(remote), back)
    assert _sha(back) == _sha(src)
    assert not [p for p in remote.parent.iterdir() if p.name != "model.pte"]  # no temp files


def test_adb_cli_push_pull(shared_virtual_farm, dev, tmp_path):
    src = tmp_path / "blob.bin"
    src.write_bytes(os.urandom(3 * 1024 * 1024))
    remote = dev.workspace / "cli" / "blob.bin"
    base = [adb_binary(), "-P", str(shared_virtual_farm.adb_server.port), "-s", dev.serial]
    env = shared_virtual_farm.server.env()
    subprocess.run([*base, "push", str(src), str(remote)], check=True, env=env,
                   capture_output=True, timeout=60)
    subprocess.run([*base, "pull", str(remote), str(tmp_path / "back.bin")], check=True, env=env,
                   capture_output=True, timeout=60)
    assert _sha(tmp_path / "back.bin") == _sha(src) == _sha(remote)
    ls = subprocess.run([*base, "shell", "ls", str(remote.parent)], check=True, env=env,
                        capture_output=True, text=True, timeout=60)
    assert ls.stdout.split() == ["blob.bin"]


def test_listing_and_stat(device, dev):
    d = dev.workspace / "listing"
    d.mkdir(exist_ok=True)
    (d / "a.txt").write_bytes(b"12345")
    (d / "sub").mkdir(exist_ok=True)
    entries = {f.path: f for f in device.sync.list(str(d))}
    assert set(entries) == {"a.txt", "sub"}
    assert entries["a.txt"].size == 5
    assert entries["sub"].mode & stat.S_IFDIR
    assert device.sync.stat(str(d / "a.txt")).size == 5


def test_stat_of_missing_file(device, dev):
    info = device.sync.stat(str(dev.workspace / "does-not-exist"))
    assert info.mode == 0 and info.size == 0 and info.mtime is None
    assert not device.sync.exists(str(dev.workspace / "does-not-exist"))


def test_pull_of_missing_file_fails(device, dev):
    with pytest.raises(adbutils.AdbError, match="No such file"):
        device.sync.read_bytes(str(dev.workspace / "missing.bin"))


@pytest.mark.parametrize("where", ["/tmp/ptefarm-escape.bin", "{root}/../escape.bin"])
def test_push_outside_root_is_refused(shared_virtual_farm, device, dev, where, tmp_path):
    target = where.format(root=dev.root)
    with pytest.raises(adbutils.AdbError, match="FAIL"):  # adbutils drops the message
        device.sync.push(b"nope", target)
    assert not os.path.exists(os.path.normpath(target))
    src = tmp_path / "x.bin"
    src.write_bytes(b"nope")
    cli = subprocess.run([adb_binary(), "-P", str(shared_virtual_farm.adb_server.port), "-s",
                          dev.serial, "push", str(src), target],
                         env=shared_virtual_farm.server.env(), capture_output=True, text=True,
                         timeout=60, check=False)
    assert cli.returncode != 0
    assert "permission denied" in (cli.stderr + cli.stdout).lower()
    assert not os.path.exists(os.path.normpath(target))


def test_pull_outside_root_is_refused(device):
    with pytest.raises(adbutils.AdbError, match="permission denied"):
        device.sync.read_bytes("/etc/hostname")


def test_symlink_out_of_root_is_refused(device, dev, tmp_path):
    link = dev.workspace / "link-out"
    link.unlink(missing_ok=True)
    link.symlink_to(tmp_path)
    with pytest.raises(adbutils.AdbError, match="FAIL"):
        device.sync.push(b"nope", str(link / "f.bin"))
    assert not (tmp_path / "f.bin").exists()


def test_adb_cli_pull_directory(shared_virtual_farm, dev, tmp_path):
    """`adb pull DIR` walks it with LIS2/LST2 (ls_v2, stat_v2)."""
    tree = dev.workspace / "tree"
    (tree / "sub").mkdir(parents=True, exist_ok=True)
    (tree / "a.bin").write_bytes(b"A" * 1000)
    (tree / "sub" / "b.bin").write_bytes(os.urandom(70_000))
    subprocess.run([adb_binary(), "-P", str(shared_virtual_farm.adb_server.port), "-s", dev.serial,
                    "pull", str(tree), str(tmp_path)], check=True, capture_output=True,
                   env=shared_virtual_farm.server.env(), timeout=60)
    assert (tmp_path / "tree" / "a.bin").read_bytes() == b"A" * 1000
    assert (tmp_path / "tree" / "sub" / "b.bin").read_bytes() == (tree / "sub" / "b.bin").read_bytes()
