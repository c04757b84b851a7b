"""What a deploy promises its callers (FakeDevice: no adb): the errors it raises and what they name,
what it reports, the bounds it puts on every device call, and what its record says.

A CI job reads these: an error must name the manifest, file or device to fix; a report's figures feed
the deploy summary and progress bar; a device call without its timeout hangs a job forever.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import time
from pathlib import Path

import pytest

from farm.bundle import manifest as bundle_mod
from farm.bundle.manifest import Bundle
from farm.errors import AdbError, UsageError
from farm.execute.deploy import (
    PARTIAL_SUFFIX,
    PUSH_MTIME_AGE_S,
    RECORD_NAME,
    bundle_workspace,
    deploy,
)
from tests.support.devices import make_qnn_bundle
from tests.support.fake_device import CHUNK, FakeDevice
from tests.support.random_bundle import make_bundle


def _ws(device: FakeDevice, bundle: Bundle) -> Path:
    return Path(bundle_workspace(device, bundle))


def _record(device: FakeDevice, bundle: Bundle) -> dict:
    return json.loads((_ws(device, bundle) / RECORD_NAME).read_text())


@pytest.fixture
def qnn(tmp_path) -> Bundle:
    """A QNN-shaped bundle loaded from its manifest (errors name the manifest's path)."""
    return bundle_mod.load(make_qnn_bundle(tmp_path / "bundle", name="qnn"))


# -- bad input: one clear error naming what to fix, before the device is touched -------------------


@pytest.mark.parametrize("name", ["", "a/b", ".", "..", "nul\0byte", "new\nline"])
def test_a_bundle_name_that_is_not_one_file_name_is_refused(tmp_path, qnn, name):
    device = FakeDevice(tmp_path / "device")
    bad = dataclasses.replace(qnn, name=name)
    with pytest.raises(UsageError) as info:
        deploy(device, bad)
    assert str(info.value) == f"{qnn.manifest_path}: bundle name {name!r} must be a single file name"
    assert device.commands == []


@pytest.mark.parametrize("name", ["plan", "with space", "x..y", ".hidden"])
def test_a_plain_bundle_name_is_the_workspace_below_the_devices(tmp_path, qnn, name):
    device = FakeDevice(tmp_path / "device")
    assert bundle_workspace(device, dataclasses.replace(qnn, name=name)) == f"{device.root}/{name}"


@pytest.mark.parametrize("soc, expected", [
    ("SM8450", "device fake-1 (SM8450) is v69"),
    ("SM0000", "device fake-1 (SM0000) is of unknown HTP arch"),
    (None, "device fake-1 (unknown SoC) is of unknown HTP arch"),
])
def test_a_device_the_bundles_qnn_libraries_do_not_fit_is_named(tmp_path, qnn, soc, expected):
    device = FakeDevice(tmp_path / "device", soc=soc)
    with pytest.raises(UsageError) as info:
        deploy(device, qnn)
    assert str(info.value) == f"{qnn.manifest_path}: bundle has QNN libraries for v73, v75 only; {expected}"
    assert device.commands == []


def test_a_bundle_without_qnn_libraries_deploys_to_any_device(tmp_path):
    bundle = make_bundle(tmp_path / "b", "plain", {"model.pte": 10})
    device = FakeDevice(tmp_path / "device", soc=None)
    assert deploy(device, bundle).pushed == ["model.pte"]


def _with_file(bundle: Bundle, index: int, **changes) -> Bundle:
    files = list(bundle.files)
    files[index] = dataclasses.replace(files[index], **changes)
    return dataclasses.replace(bundle, files=files)


@pytest.mark.parametrize("name, message", [
    ("./model.pte", "file name './model.pte' is not a plain workspace name"),
    ("a//model.pte", "file name 'a//model.pte' is not a plain workspace name"),
    ("model.pte" + PARTIAL_SUFFIX, f"file name 'model.pte{PARTIAL_SUFFIX}' is not a plain workspace name"),
    ("x" + PARTIAL_SUFFIX + "-1", f"file name 'x{PARTIAL_SUFFIX}-1' is not a plain workspace name"),
    (RECORD_NAME, f"file name '{RECORD_NAME}' is not a plain workspace name"),
    ("../escape", "files[1]: file name '../escape' escapes the workspace ('..')"),
    ("lib.so", "two files named 'lib.so' for HTP arch v75"),
])
def test_a_file_name_the_workspace_cannot_hold_is_refused_naming_it(tmp_path, name, message):
    bundle = make_bundle(tmp_path / "b", "names", {"model.pte": 10, "other.so": 5, "lib.so": 3})
    bad = _with_file(bundle, 1, name=name)
    device = FakeDevice(tmp_path / "device")
    with pytest.raises(UsageError) as info:
        deploy(device, bad)
    assert str(info.value) == f"names: {message}"  # a bundle without a manifest: its name
    assert device.commands == []


def test_a_missing_or_resized_host_file_is_refused_naming_it(tmp_path, qnn):
    device = FakeDevice(tmp_path / "device")
    pte = next(f for f in qnn.files if f.name == "kv.pte")
    pte.path.write_bytes(pte.path.read_bytes() + b"!")
    with pytest.raises(UsageError) as info:
        deploy(device, qnn)
    assert str(info.value) == (f"{qnn.manifest_path}: {pte.path} is {pte.size + 1} bytes, "
                               f"manifest says {pte.size}")
    pte.path.unlink()
    with pytest.raises(UsageError) as info:
        deploy(device, qnn)
    assert str(info.value) == f"{qnn.manifest_path}: cannot read {pte.path}: No such file or directory"
    assert device.commands == []


def test_an_unknown_verify_level_is_refused(tmp_path, qnn):
    device = FakeDevice(tmp_path / "device")
    with pytest.raises(UsageError) as info:
        deploy(device, qnn, verify="paranoid")
    assert str(info.value) == "verify level 'paranoid' is not one of ('fast', 'full')"
    assert device.commands == []


def test_a_workspace_that_cannot_be_made_is_a_device_error_naming_it(tmp_path, qnn):
    device = FakeDevice(tmp_path / "device")
    device.root.joinpath(qnn.name).write_text("a file where the workspace should be")
    with pytest.raises(AdbError) as info:
        deploy(device, qnn)
    message = str(info.value)
    assert message.startswith(f"device fake-1: cannot create workspace {device.root}/qnn: ")
    assert "File exists" in message and info.value.serial == "fake-1"


@pytest.mark.parametrize("available_kib, fits", [(1, True), (0, False)])
def test_a_deploy_fits_when_the_free_space_is_exactly_what_it_needs(tmp_path, available_kib, fits):
    bundle = make_bundle(tmp_path / "b", "fit", {"model.pte": 1000, "lib.so": 24})  # 1 KiB in all
    df = ("#!/bin/sh\necho 'Filesystem 1K-blocks Used Available Use% Mounted on'\n"
          f"echo '/dev/block/dm-48 100 99 {available_kib} 99% /data'\n")
    device = FakeDevice(tmp_path / "device", programs={"df": df})
    if fits:
        assert deploy(device, bundle).bytes_pushed == 1024
        return
    with pytest.raises(AdbError) as info:
        deploy(device, bundle)
    assert str(info.value) == (f"device fake-1: {device.root}/fit has 0 bytes free, deploy needs "
                               f"1024 bytes")
    assert info.value.serial == "fake-1" and device.pushes == []


def test_a_device_that_fills_up_mid_push_says_how_much_was_left_to_write(tmp_path):
    bundle = make_bundle(tmp_path / "b", "full", {"model.pte": 4 * CHUNK})

    class FillsUp(FakeDevice):
        def push(self, src, remote, *, on_bytes=None, **kwargs):
            if RECORD_NAME not in remote:
                on_bytes(CHUNK)  # two blocks written, then the disk is full
                on_bytes(CHUNK)
                raise AdbError(f"device {self.serial}: No space left on device", serial=self.serial)
            return super().push(src, remote, on_bytes=on_bytes, **kwargs)

    device = FillsUp(tmp_path / "device")
    with pytest.raises(AdbError) as info:
        deploy(device, bundle)
    assert str(info.value) == (f"device fake-1: storage full in {device.root}/full: deploy needs "
                               f"{4 * CHUNK} bytes, {2 * CHUNK} of them not yet written when pushing "
                               f"model.pte failed (device fake-1: No space left on device)")
    assert info.value.serial == "fake-1"


def test_a_push_error_other_than_a_full_disk_is_raised_as_the_device_said(tmp_path):
    bundle = make_bundle(tmp_path / "b", "broken", {"model.pte": 100})

    class Broken(FakeDevice):
        def push(self, src, remote, **kwargs):
            raise AdbError(f"device {self.serial}: connection reset", serial=self.serial)

    with pytest.raises(AdbError) as info:
        deploy(Broken(tmp_path / "device"), bundle)
    assert str(info.value) == "device fake-1: connection reset"


# -- what a deploy reports ------------------------------------------------------------------------


def test_the_report_the_summary_and_the_progress_count_what_was_pushed(tmp_path):
    sizes = {"model.pte": 3 * CHUNK + 5, "libA.so": CHUNK, "libB.so": 7}
    bundle = make_bundle(tmp_path / "b", "counts", sizes)
    device = FakeDevice(tmp_path / "device", serial="phone-7")
    planned: list[int] = []
    progress: dict[str, int] = {}

    def on_progress(name, n):
        progress[name] = progress.get(name, 0) + n

    report = deploy(device, bundle, on_plan=planned.append, on_progress=on_progress)
    ws = f"{device.root}/counts"
    total = sum(sizes.values())
    assert planned == [total] and progress == sizes
    assert report.to_dict() == {"serial": "phone-7", "workspace": ws, "files_pushed": 3,
                                "bytes_pushed": total, "files_skipped": 0, "files_hashed": 0,
                                "seconds": report.seconds, "pushed": list(sizes), "chunks": None}
    assert 0 < report.seconds < 600
    assert report.summary() == (f"phone-7: pushed 3 files ({total} bytes), skipped 0, hashed 0 on "
                                f"device, {report.seconds:.2f} s -> {ws}")

    (_ws(device, bundle) / "libB.so").write_bytes(b"x" * 7)  # changed on the device: one re-push
    planned.clear()
    again = deploy(device, bundle, on_plan=planned.append)
    assert planned == [7]
    assert (again.files_pushed, again.bytes_pushed, again.files_skipped, again.files_hashed,
            again.pushed) == (1, 7, 2, 1, ["libB.so"])
    assert again.seconds > 0


def test_pushed_files_are_dated_in_the_past_and_the_record_after_them(tmp_path):
    """The record vouches for a file by its size and mtime; a file strictly older than the record
    cannot have changed without moving its mtime (see the module docstring)."""
    bundle = make_bundle(tmp_path / "b", "dates", {"model.pte": 100, "lib.so": 10})
    device = FakeDevice(tmp_path / "device")
    before = int(time.time())
    deploy(device, bundle)
    after = int(time.time())
    ws = _ws(device, bundle)
    record = _record(device, bundle)
    assert record["bundle"] == "dates"
    for f in bundle.files:
        mtime = int(os.stat(ws / f.name).st_mtime)
        assert before - PUSH_MTIME_AGE_S <= mtime <= after - PUSH_MTIME_AGE_S
        assert record["files"][f.name] == {"sha256": f.sha256, "size": f.size, "mtime": mtime}
        assert mtime < os.stat(ws / RECORD_NAME).st_mtime
    assert oct(os.stat(ws / "model.pte").st_mode & 0o777) == oct(0o644)


def test_kept_files_are_recorded_with_the_mtime_the_device_shows(tmp_path):
    bundle = make_bundle(tmp_path / "b", "kept", {"model.pte": 100, "lib.so": 10})
    device = FakeDevice(tmp_path / "device")
    deploy(device, bundle)
    ws = _ws(device, bundle)
    os.utime(ws / "lib.so", (1_000_000, 1_000_000))  # moved: hashed, found right, kept
    (ws / RECORD_NAME).write_text("{}")
    os.utime(ws / RECORD_NAME, (2_000_000, 2_000_000))
    report = deploy(device, bundle)
    assert report.pushed == [] and report.files_hashed == 2
    assert _record(device, bundle)["files"]["lib.so"]["mtime"] == 1_000_000


# -- a record the deploy cannot use costs hashing, never a wrong skip ------------------------------


@pytest.mark.parametrize("record", [
    "not json", "[]", '{"files": []}', '{"files": {"model.pte": "x"}}', '{"other": {}}', "",
    '{"files": {"model.pte": {"size": 100, "mtime": 0}}}',
])
def test_an_unusable_record_makes_the_deploy_hash_what_it_finds(tmp_path, record):
    bundle = make_bundle(tmp_path / "b", "records", {"model.pte": 100})
    device = FakeDevice(tmp_path / "device")
    deploy(device, bundle)
    ws = _ws(device, bundle)
    (ws / RECORD_NAME).write_text(record)
    mtime = int(os.stat(ws / "model.pte").st_mtime)
    if "mtime" in record:  # a record that matches size and mtime but holds no digest
        (ws / RECORD_NAME).write_text(record.replace('"mtime": 0', f'"mtime": {mtime}'))
    os.utime(ws / RECORD_NAME, (mtime + 10, mtime + 10))
    report = deploy(device, bundle)
    assert (report.files_hashed, report.files_pushed) == (1, 0)
    assert device.hashed()[-1:] == ["model.pte"]
    assert _record(device, bundle)["files"]["model.pte"]["sha256"] == bundle.files[0].sha256


def test_a_record_that_vouches_for_other_content_makes_the_deploy_push(tmp_path):
    bundle = make_bundle(tmp_path / "b", "other", {"model.pte": 100})
    device = FakeDevice(tmp_path / "device")
    deploy(device, bundle)
    ws = _ws(device, bundle)
    record = _record(device, bundle)
    record["files"]["model.pte"]["sha256"] = "0" * 64  # what an older build left there
    (ws / RECORD_NAME).write_text(json.dumps(record))
    device.pushes.clear()
    report = deploy(device, bundle)
    assert report.pushed == ["model.pte"] and report.files_hashed == 0  # no need to hash: push
    assert _record(device, bundle)["files"]["model.pte"]["sha256"] == bundle.files[0].sha256


def test_a_device_file_dated_before_1970_is_still_recognised(tmp_path):
    bundle = make_bundle(tmp_path / "b", "old", {"model.pte": 100})
    device = FakeDevice(tmp_path / "device")
    deploy(device, bundle)
    ws = _ws(device, bundle)
    os.utime(ws / "model.pte", (-86400, -86400))  # a phone whose clock was never set
    first = deploy(device, bundle)
    assert (first.files_hashed, first.files_pushed) == (1, 0)
    assert _record(device, bundle)["files"]["model.pte"]["mtime"] == -86400
    second = deploy(device, bundle)
    assert (second.files_hashed, second.files_pushed, second.files_skipped) == (0, 0, 1)


# -- every device call is bounded, and pushes share kept sync streams ------------------------------


class RecordingDevice(FakeDevice):
    """Records each call's timeout, and whether it ran inside ``keep_sync``."""

    def __init__(self, root: Path, **kwargs):
        super().__init__(root, **kwargs)
        self.calls: list[tuple[str, str, float, bool]] = []
        self.kept = False
        self.fail_push_of: str | None = None

    @contextlib.contextmanager
    def keep_sync(self):
        assert not self.kept
        self.kept = True
        try:
            yield
        finally:
            self.kept = False

    def shell(self, command, *, timeout, check=False):
        self.calls.append(("shell", command, timeout, self.kept))
        return super().shell(command, timeout=timeout, check=check)

    def push(self, src, remote, *, timeout=60.0, **kwargs):
        self.calls.append(("push", remote, timeout, self.kept))
        if self.fail_push_of and remote.endswith(self.fail_push_of + PARTIAL_SUFFIX):
            raise AdbError(f"device {self.serial}: push failed", serial=self.serial)
        return super().push(src, remote, timeout=timeout, **kwargs)


def test_every_device_call_is_bounded_by_the_callers_timeouts(tmp_path, caplog):
    bundle = make_bundle(tmp_path / "b", "bounded", {"model.pte": 1000, "lib.so": 10})
    device = RecordingDevice(tmp_path / "device")
    deploy(device, bundle, timeout=7, hash_timeout=99)
    (_ws(device, bundle) / RECORD_NAME).unlink()  # the next deploy hashes
    deploy(device, bundle, timeout=7, hash_timeout=99)
    device.fail_push_of = "lib.so"
    (_ws(device, bundle) / "lib.so").unlink()
    (_ws(device, bundle) / "model.pte").unlink()
    with pytest.raises(AdbError, match="push failed"):
        deploy(device, bundle, timeout=7, hash_timeout=99)
    kinds: dict[tuple[str, bool], set[float]] = {}
    for kind, what, timeout, _ in device.calls:
        kinds.setdefault((kind, "sha256sum" in what), set()).add(timeout)
    assert kinds == {("shell", False): {7}, ("shell", True): {99}, ("push", False): {7}}
    assert any(what.startswith("rm -f -- ") for _, what, _, _ in device.calls)  # the discard


def test_pushes_and_the_record_share_kept_sync_streams_and_the_renames_follow(tmp_path):
    bundle = make_bundle(tmp_path / "b", "kept", {"model.pte": 1000, "lib.so": 10})
    device = RecordingDevice(tmp_path / "device")
    deploy(device, bundle)
    pushes = [kept for kind, _, _, kept in device.calls if kind == "push"]
    assert len(pushes) == 3 and all(pushes)  # two files and the record
    last = device.calls[-1]
    assert last[0] == "shell" and " mv -f -- " in last[1] and not last[3]


def test_a_failed_cleanup_is_logged_naming_the_device_and_files(tmp_path, caplog):
    bundle = make_bundle(tmp_path / "b", "cleanup", {"model.pte": 1000})

    class NoCleanup(RecordingDevice):
        def shell(self, command, *, timeout, check=False):
            if command.startswith("rm -f -- "):
                raise AdbError(f"device {self.serial}: offline", serial=self.serial)
            return super().shell(command, timeout=timeout, check=check)

    device = NoCleanup(tmp_path / "device")
    device.fail_push_of = "model.pte"
    with caplog.at_level(logging.WARNING, logger="farm.execute.deploy"), \
            pytest.raises(AdbError, match="push failed"):
        deploy(device, bundle)
    partial = f"{device.root}/cleanup/model.pte{PARTIAL_SUFFIX}"
    assert [r.getMessage() for r in caplog.records] == [
        f"device fake-1: could not remove {partial} (the next deploy will): device fake-1: offline"]


def test_the_bundles_runner_is_made_executable_again_when_kept(tmp_path, qnn):
    """A runner that lost its execute bit on the device (a manual chmod, a copy that dropped the
    mode) is kept when its bytes are right, and made executable: the run would otherwise fail."""
    device = FakeDevice(tmp_path / "device")
    deploy(device, qnn)
    runner = _ws(device, qnn) / "qnn_llama_runner"
    assert os.access(runner, os.X_OK)
    runner.chmod(0o644)
    report = deploy(device, qnn, verify="full")
    assert report.pushed == [] and os.access(runner, os.X_OK)
    assert not os.access(_ws(device, qnn) / "kv.pte", os.X_OK)  # only the runner


def test_a_bundle_stated_in_several_commands_bounds_each_by_the_callers_timeout(tmp_path):
    """Names too many for one stat command: every further stat, the pushes and the record's push
    still carry the caller's timeout (a call without it waits its own default, or forever)."""
    names = {f"{'n' * 200}{i:03d}.bin": 1 for i in range(100)}  # ~20 KB of names: several commands
    bundle = make_bundle(tmp_path / "b", "many", names)
    device = RecordingDevice(tmp_path / "device")
    deploy(device, bundle, timeout=7)
    stats = [c for c in device.calls if c[0] == "shell" and " stat -c " in c[1]]
    assert len(stats) >= 2, "the names fit in one command: the test needs more"
    assert {timeout for _, _, timeout, _ in device.calls} == {7}
    assert sum(1 for kind, what, _, _ in device.calls if kind == "push" and RECORD_NAME in what) == 1


def test_each_hash_command_is_as_full_as_the_bound_allows_and_never_longer(tmp_path):
    """The files in doubt are hashed in as few commands as fit in COMMAND_BYTES: names that fill a
    command to the byte stay in it, and one more name of a single byte goes to the next."""
    import shlex

    from farm.execute.devicecmd import COMMAND_BYTES

    device = RecordingDevice(tmp_path / "device")
    ws = f"{device.root}/exact"
    room = COMMAND_BYTES - len(f"cd {shlex.quote(ws)} && sha256sum --") - 1  # " " before the names
    sizes, used = {}, -1
    while room - used > 256:  # 200-byte names while they fit, then one (at most 255) to fill it
        sizes[f"{len(sizes):04d}{'x' * 196}"] = 1
        used += 201
    last = room - used - 1
    sizes[f"{len(sizes):04d}{'y' * (last - 4)}"] = 1
    sizes["z"] = 1  # one byte: it would fit in one more byte, or two
    bundle = make_bundle(tmp_path / "b", "exact", sizes)
    deploy(device, bundle)
    (_ws(device, bundle) / RECORD_NAME).unlink()  # the next deploy hashes every file
    device.calls.clear()
    assert deploy(device, bundle).files_hashed == len(sizes)
    hashes = [what for kind, what, _, _ in device.calls if kind == "shell" and "sha256sum" in what]
    assert [len(h.encode()) for h in hashes] == [COMMAND_BYTES, len(f"cd {shlex.quote(ws)} && sha256sum -- z")]
    assert all(len(what.encode()) <= COMMAND_BYTES for kind, what, _, _ in device.calls if kind == "shell")


def test_a_probe_answer_cut_short_trusts_nothing_and_pushes_everything(tmp_path):
    """A device whose probe printed nothing (no stat, no record, no df: a shell that lost its output)
    is taken to hold none of the files: all are pushed, and the deploy still finishes."""
    bundle = make_bundle(tmp_path / "b", "short", {"model.pte": 1000, "lib.so": 10})
    device = FakeDevice(tmp_path / "device")
    deploy(device, bundle)

    class Mute(FakeDevice):
        def shell(self, command, *, timeout, check=False):
            result = super().shell(command, timeout=timeout, check=check)
            if "@@stat" in command:
                return dataclasses.replace(result, stdout=b"")
            return result

    mute = Mute(tmp_path / "device")
    report = deploy(mute, bundle)
    assert (report.files_pushed, report.files_hashed, report.files_skipped) == (2, 0, 0)
    assert deploy(FakeDevice(tmp_path / "device"), bundle).files_pushed == 0  # and the record is good


def test_a_failed_rename_into_place_fails_the_deploy(tmp_path):
    bundle = make_bundle(tmp_path / "b", "renames", {"model.pte": 1000})
    device = FakeDevice(tmp_path / "device", programs={"mv": "#!/bin/sh\necho 'mv: read-only' >&2\nexit 1\n"})
    with pytest.raises(AdbError, match="exited 1: mv: read-only"):
        deploy(device, bundle)
    assert not (_ws(device, bundle) / RECORD_NAME).exists()  # no record vouches for the workspace


def test_a_deploy_with_nothing_to_do_says_how_long_it_took(tmp_path):
    bundle = make_bundle(tmp_path / "b", "idle", {"model.pte": 1000})
    device = FakeDevice(tmp_path / "device")
    deploy(device, bundle)
    report = deploy(device, bundle)
    assert report.pushed == [] and report.files_hashed == 0
    assert 0 < report.seconds < 30


def test_a_file_named_like_an_option_is_stated_and_kept(tmp_path):
    """``-n.bin`` is a file to stat and hash, not an option: a second deploy keeps it."""
    bundle = make_bundle(tmp_path / "b", "dash", {"model.pte": 100, "-n.bin": 10})
    device = FakeDevice(tmp_path / "device")
    assert deploy(device, bundle).files_pushed == 2
    assert deploy(device, bundle).pushed == []
    (_ws(device, bundle) / RECORD_NAME).unlink()
    second = deploy(device, bundle)
    assert second.pushed == [] and second.files_hashed == 2


@pytest.mark.parametrize("change, reason", [
    (lambda path: path.unlink(), "No such file or directory"),
    (lambda path: (path.unlink(), path.mkdir()), "Is a directory"),
])
def test_a_host_file_gone_between_planning_and_pushing_is_named(tmp_path, qnn, change, reason):
    """The bundle's file checked when the deploy started and gone (or a directory) by the time it is
    pushed: bad input naming the manifest and the file, and nothing half-deployed."""
    pte = next(f for f in qnn.files if f.name == "kv.pte")

    class Racing(FakeDevice):
        def shell(self, command, *, timeout, check=False):
            if "@@stat" in command and pte.path.is_file():
                change(pte.path)  # while the device is probed: after the plan's own checks
            return super().shell(command, timeout=timeout, check=check)

    device = Racing(tmp_path / "device")
    with pytest.raises(UsageError) as info:
        deploy(device, qnn)
    assert str(info.value) == f"{qnn.manifest_path}: cannot read {pte.path}: {reason}"
    assert not list(_ws(device, qnn).glob(f"*{PARTIAL_SUFFIX}*"))
    assert not (_ws(device, qnn) / RECORD_NAME).exists()


def test_stat_lines_it_cannot_read_are_files_it_does_not_have():
    from farm.execute.devicecmd import parse_stat as _parse_stat

    found = _parse_stat("12 1700000000 a.bin\nsize? 1700000000 b.bin\n12 -5  lead.bin\n"
                        "stat: cannot stat 'c.bin'\n7 1700000000")
    assert {name: (r.size, r.mtime) for name, r in found.items()} == {
        "a.bin": (12, 1700000000), " lead.bin": (12, -5)}
