"""A bundle of thousands of files deploys (issue 24, item 7): no shell command is longer than a device
takes (FakeDevice: no adb).

A phone refuses a command beyond its argument limit (the adb server reads a request's length as four
hex digits; adbd runs the command as one ``sh -c`` argument), so a deploy that put every file name into
one ``stat``, ``sha256sum`` or rename chain failed on every device for a 10,000-file bundle, counted
as an infrastructure error against the devices. Each step is now cut into commands of at most
``COMMAND_BYTES``, with the quoting and the ordering guarantees of the one-command form.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from farm.bundle.manifest import Bundle, describe_file
from farm.errors import AdbError
from farm.execute import devicecmd
from farm.execute.deploy import PARTIAL_SUFFIX, RECORD_NAME, bundle_workspace, deploy
from tests.support.fake_device import FakeDevice
from tests.support.random_bundle import make_bundle

ADB_REQUEST_MAX = 0xFFFF  # the adb server reads a request's length as four hex digits
SHELL_SERVICE = "shell,v2,raw:"


class ArgLimitDevice(FakeDevice):
    """A FakeDevice that refuses a command too long for one adb shell request, as a phone does (an
    ``AdbError`` before anything runs), and that can be told to fail the commands a test picks."""

    def __init__(self, root: Path, limit: int = ADB_REQUEST_MAX - len(SHELL_SERVICE), **kwargs):
        super().__init__(root, **kwargs)
        self.limit = limit
        self.refused: list[str] = []
        self.fail_when = lambda command: False

    def shell(self, command, *, timeout, check=False):
        if len(command.encode()) > self.limit or self.fail_when(command):
            self.refused.append(command)
            raise AdbError(f"device {self.serial}: command of {len(command.encode())} bytes refused",
                           serial=self.serial)
        return super().shell(command, timeout=timeout, check=check)


def _ws(device: FakeDevice, bundle: Bundle) -> Path:
    return Path(bundle_workspace(device, bundle))


def _record(device: FakeDevice, bundle: Bundle) -> dict:
    path = _ws(device, bundle) / RECORD_NAME
    return json.loads(path.read_text())["files"] if path.exists() else {}


def _holds_exactly(device: FakeDevice, bundle: Bundle) -> None:
    """The workspace holds every file of the bundle with its bytes, the record vouches for each with
    its manifest digest, and no partial file is left."""
    ws = _ws(device, bundle)
    record = _record(device, bundle)
    for f in bundle.files:
        assert (ws / f.name).read_bytes() == f.path.read_bytes(), f.name
        assert record[f.name]["sha256"] == f.sha256, f.name
    assert set(record) == {f.name for f in bundle.files}
    assert not [p for p in ws.rglob("*") if PARTIAL_SUFFIX in p.name]


# Names that need quoting, each of a kind a careless join would break (or run).
AWKWARD = ["with space.so", "it's.so", "$(touch pwned).so", "back\\slash.so", "dir\\nname.so",
           "semi;colon.so", "two  spaces.so", "star*.so", "dash-leading.so", "ünïcode.so",
           "carriage\rreturn.so", "&& rm -rf x.so"]


@pytest.fixture
def small_limit(monkeypatch):
    """A command bound small enough that a few dozen files need several commands at every step."""
    monkeypatch.setattr(devicecmd, "COMMAND_BYTES", 700)
    return 700


def _bundle_of(tmp_path: Path, count: int, *, awkward: bool = True) -> Bundle:
    sizes = {"model.pte": 3000}
    sizes.update({f"lib/part-{i:05d}.so": 1 + i % 97 for i in range(count)})
    if awkward:
        sizes.update({name: 50 + i for i, name in enumerate(AWKWARD)})
    return make_bundle(tmp_path / "b", "many", sizes)


def test_every_step_of_a_deploy_is_cut_into_commands_the_device_takes(tmp_path, small_limit):
    bundle = _bundle_of(tmp_path, 40)
    device = ArgLimitDevice(tmp_path / "device", limit=small_limit)

    first = deploy(device, bundle)
    assert device.refused == []
    assert first.files_pushed == len(bundle.files) and sorted(first.pushed) == sorted(
        f.name for f in bundle.files)
    _holds_exactly(device, bundle)
    assert not (_ws(device, bundle) / "pwned").exists()  # the names were quoted, never run
    assert max(len(c.encode()) for c in device.commands) <= small_limit
    renames = [c for c in device.commands if " mv -f -- " in c]
    assert len(renames) > 1  # the rename chain did not fit one command

    # The second deploy stats every file (in several commands) and trusts the record for each.
    device.commands.clear()
    device.pushes.clear()
    second = deploy(device, bundle)
    assert (second.files_pushed, second.files_skipped, second.files_hashed) == (0, len(bundle.files), 0)
    assert device.pushes == [] and device.refused == []
    stats = [c for c in device.commands if "stat -c" in c]
    assert len(stats) > 1 and len(stats) == len(device.commands)

    # Without a record every file is hashed (in several commands) and found right: nothing pushed.
    (_ws(device, bundle) / RECORD_NAME).unlink()
    device.commands.clear()
    third = deploy(device, bundle)
    assert sorted(device.hashed()) == sorted(f.name for f in bundle.files)
    assert len([c for c in device.commands if "sha256sum" in c]) > 1
    assert (third.files_pushed, third.files_hashed) == (0, len(bundle.files))
    assert [p for p in device.pushes if RECORD_NAME not in p] == [] and device.refused == []
    _holds_exactly(device, bundle)


def test_a_deploy_whose_renames_stop_half_way_leaves_no_record_vouching_for_them(tmp_path,
                                                                                 small_limit):
    """The rename chain cut into several commands keeps the one-command guarantee: the old record
    goes in the first command, the new one comes in with the last, so a failure in between leaves no
    record at all (the next deploy hashes what it finds), never one that vouches for a replaced file."""
    bundle = _bundle_of(tmp_path, 40, awkward=False)
    device = ArgLimitDevice(tmp_path / "device", limit=small_limit)
    deploy(device, bundle)
    ws = _ws(device, bundle)
    old_record = _record(device, bundle)

    for f in bundle.files:  # the next build: every file changes, same sizes
        f.path.write_bytes(os.urandom(f.size))
    bundle = dataclasses.replace(bundle, files=[describe_file(tmp_path / "b", f.path, role=f.role,
                                                              name=f.name)
                                                for f in bundle.files])

    renames = []

    def fail_the_second_rename_command(command):
        if " mv -f -- " in command:
            renames.append(command)
            return len(renames) == 2
        return False

    device.fail_when = fail_the_second_rename_command
    with pytest.raises(AdbError):
        deploy(device, bundle)
    assert len(renames) == 2
    assert not (ws / RECORD_NAME).exists() and old_record  # the old record went with the first

    device.fail_when = lambda command: False
    report = deploy(device, bundle)  # no record: what was renamed is hashed and kept, the rest pushed
    assert report.files_hashed > 0 and report.files_pushed > 0
    _holds_exactly(device, bundle)


def test_an_interrupted_deploy_of_many_files_removes_every_partial_file(tmp_path, small_limit):
    bundle = _bundle_of(tmp_path, 40)

    class Failing(ArgLimitDevice):
        def push(self, src, remote, **kwargs):
            sent = super().push(src, remote, **kwargs)
            if remote.endswith("part-00020.so" + PARTIAL_SUFFIX):  # one of the smaller files
                raise AdbError(f"device {self.serial}: push of {remote} failed", serial=self.serial)
            return sent

    device = Failing(tmp_path / "device", limit=small_limit)
    with pytest.raises(AdbError, match="push of"):
        deploy(device, bundle)
    ws = _ws(device, bundle)
    removals = [c for c in device.commands if c.startswith("rm -f -- ")]
    assert len(removals) > 1 and device.refused == []
    assert not [p for p in ws.rglob("*") if PARTIAL_SUFFIX in p.name]
    assert not (ws / RECORD_NAME).exists()
