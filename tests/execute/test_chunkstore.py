"""Unit tests of farm.execute.chunkstore on a FakeDevice (no adb): how the store is listed and read,
what a chunked push leaves on the device when it works and when it fails part-way, how a file is
assembled and checked, what is evicted, and the exact commands, bounds and errors a deploy relies on."""

from __future__ import annotations

import hashlib
import io
import logging
import os
import posixpath
import shlex
import threading
import time
from pathlib import Path

import pytest

from farm.bundle.manifest import file_identity
from farm.errors import AdbError, DeviceTimeout
from farm.execute import chunkstore
from farm.execute.chunking import Chunk, FileChunks
from farm.execute.chunkstore import (
    STORE_DIR,
    ChunkStats,
    Stored,
    _Slice,
    assemble,
    assembled_wrong,
    damaged,
    device_digests,
    evict,
    listing_command,
    missing,
    new_batch,
    parse_listing,
    push_chunks,
    referenced,
    remove,
    store_dir,
)
from farm.execute.devicecmd import COMMAND_BYTES, PARTIAL_SUFFIX
from tests.support.fake_device import FakeDevice

LOGGER = "farm.execute.chunkstore"


class Cancelled(Exception):
    pass


class RecordingDevice(FakeDevice):
    """A FakeDevice that also records the keyword arguments of every call, and the thread of each push."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.shell_calls: list[tuple[str, dict]] = []
        self.push_calls: list[tuple[str, dict]] = []
        self.push_threads: list[str] = []

    def shell(self, command, **kwargs):
        self.shell_calls.append((command, kwargs))
        return super().shell(command, **kwargs)

    def push(self, src, remote, **kwargs):
        self.push_calls.append((remote, kwargs))
        self.push_threads.append(threading.current_thread().name)
        return super().push(src, remote, **kwargs)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def plan_of(path: Path, pieces: list[bytes]) -> FileChunks:
    """Write ``pieces`` to ``path`` and return its chunk plan, cut at the pieces' boundaries."""
    path.write_bytes(b"".join(pieces))
    chunks, offset = [], 0
    for piece in pieces:
        chunks.append(Chunk(offset, len(piece), sha(piece)))
        offset += len(piece)
    return FileChunks(path, offset, sha(path.read_bytes()), tuple(chunks), file_identity(os.stat(path)))


def put(store: Path, path: str, data: bytes, mtime: int | None = None) -> None:
    """Write a file into the device's store (``path`` relative to it)."""
    f = store / path
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_bytes(data)
    if mtime is not None:
        os.utime(f, (mtime, mtime))


def names_joined_to(length: int, prefix: str = "n") -> list[str]:
    """Distinct shell-safe names whose space-joined length is exactly ``length``."""
    size = 100
    count = (length + 1) // (size + 1)
    names = [f"{prefix}{i:05d}".ljust(size, "x") for i in range(count)]
    names[-1] += "y" * (length - (count * (size + 1) - 1))
    assert len(" ".join(names)) == length
    return names


def push_all(device, store, wanted, stored, *, cancel=None, on_bytes=None, timeout=7.0):
    push_chunks(device, store, wanted, stored, timeout=timeout,
                on_bytes=on_bytes or (lambda name, n: None), cancel=cancel or threading.Event(),
                cancelled=Cancelled)


@pytest.fixture
def device(tmp_path):
    return RecordingDevice(tmp_path / "phone")


@pytest.fixture
def store(device):
    path = Path(store_dir(device))
    path.mkdir()
    return path


# -- the listing ------------------------------------------------------------------------------------


def test_store_dir_is_the_chunk_folder_of_the_device_workspace(device):
    assert store_dir(device) == posixpath.join(device.workspace, STORE_DIR)


def test_listing_command_creates_the_store_drops_partial_batches_and_lists_every_chunk(device):
    store = store_dir(device)
    good, other = b"a" * 10, b"b" * 3
    out = device.shell(listing_command(store), timeout=5).out  # the store does not exist yet
    assert os.path.isdir(store) and parse_listing(out) == ({}, [])
    put(Path(store), f"b 1/{sha(good)}", good, mtime=-7)
    put(Path(store), f"b2{PARTIAL_SUFFIX}/{sha(other)}", other)
    put(Path(store), f"b3/.{sha(other)}{PARTIAL_SUFFIX}.tmp", other)
    found, strays = parse_listing(device.shell(listing_command(store), timeout=5).out)
    assert found == {sha(good): Stored(10, -7, f"b 1/{sha(good)}")}
    assert strays == []
    assert sorted(p.name for p in Path(store).rglob("*")) == ["b 1", "b3", sha(good)]


def test_parse_listing_keeps_the_bigger_copy_of_a_chunk_and_calls_the_smaller_a_stray():
    s = "a" * 64
    # The bigger copy is the older one: its size, not its mtime, decides.
    found, strays = parse_listing(f"9 100 ./b1/{s}\n5 200 ./b2/{s}\n")
    assert found == {s: Stored(9, 100, f"b1/{s}")} and strays == [f"b2/{s}"]
    found, strays = parse_listing(f"5 200 ./b2/{s}\n9 100 ./b1/{s}\n")
    assert found == {s: Stored(9, 100, f"b1/{s}")} and strays == [f"b2/{s}"]
    found, strays = parse_listing(f"9 100 ./b1/{s}\n9 200 ./b2/{s}\n")  # same size: the first stays
    assert found == {s: Stored(9, 100, f"b1/{s}")} and strays == [f"b2/{s}"]


def test_parse_listing_skips_lines_of_odd_shape_and_reads_the_lines_after_them():
    s, t = "a" * 64, "b" * 64
    odd = ["", "12", "12 34", f"12  34 ./b1/{t}", f"12\t34 ./b1/{t}", f"x 5 ./b1/{t}", f"-1 5 ./b1/{t}",
           f"1 X2 ./b1/{t}", f"1 2- ./b1/{t}", f"1 - ./b1/{t}", "5 3 ./b1/short", f"5 3 ./b1/sub/{t}",
           f"5 3 ./b1{PARTIAL_SUFFIX}/{t}", f"5 3 ./b1/{t[:-1]}"]
    for line in odd:
        assert parse_listing(f"{line}\n7 8 ./b9/{s}\n") == ({s: Stored(7, 8, f"b9/{s}")}, []), line
        assert parse_listing(line) == ({}, []), line


def test_parse_listing_reads_negative_mtimes_paths_with_spaces_and_chunks_outside_a_batch():
    s, t = "c" * 64, "d" * 64
    found, strays = parse_listing(f"7 -20 ./b 1 x/{s}\n3 -1 ./{t}")
    assert found == {s: Stored(7, -20, f"b 1 x/{s}"), t: Stored(3, -1, t)}
    assert strays == []


# -- removing ------------------------------------------------------------------------------------


def test_remove_deletes_the_chunks_then_only_the_batches_left_empty(device, store):
    for path in ("b1/x", "b1/y", "b2/z", "b 3/w", "top"):
        put(store, path, b"1")
    remove(device, str(store), ["b1/x", "b2/z", "b 3/w", "top"], timeout=9)
    assert sorted(str(p.relative_to(store)) for p in store.rglob("*")) == ["b1", "b1/y"]
    (rm, rm_kw), (rmdir, rmdir_kw) = device.shell_calls
    assert rm_kw == {"timeout": 9, "check": True}
    assert rmdir_kw == {"timeout": 9}
    assert rmdir == f"cd {shlex.quote(str(store))} && rmdir -- 'b 3' b1 b2 2>/dev/null; true"


def test_remove_of_chunks_outside_any_batch_sends_no_rmdir(device, store):
    put(store, "top", b"1")
    remove(device, str(store), ["top"], timeout=9)
    assert device.commands == [f"cd {shlex.quote(str(store))} && rm -f -- top"]
    assert not (store / "top").exists()


def test_remove_raises_the_device_error_naming_the_serial_when_rm_fails(tmp_path):
    device = RecordingDevice(tmp_path / "phone", serial="broken-7",
                             programs={"rm": "#!/bin/sh\necho rm refused >&2\nexit 1\n"})
    with pytest.raises(AdbError, match="rm refused") as e:
        remove(device, device.workspace, ["b1/x"], timeout=9)
    assert e.value.serial == "broken-7" and "device broken-7" in str(e.value)


def test_remove_fills_each_rm_up_to_the_command_bound_and_no_further(device, store):
    room = COMMAND_BYTES - len(f"cd {shlex.quote(str(store))} && rm -f --") - 1
    remove(device, str(store), names_joined_to(room), timeout=9)
    assert [len(c) for c in device.commands] == [COMMAND_BYTES]
    device.commands.clear()
    remove(device, str(store), names_joined_to(room + 1), timeout=9)
    assert len(device.commands) == 2 and all(len(c) <= COMMAND_BYTES for c in device.commands)


def test_remove_fills_each_rmdir_up_to_the_command_bound_and_no_further(device, store):
    room = COMMAND_BYTES - len(f"cd {shlex.quote(str(store))} && rmdir --") - 20

    def rmdirs() -> list[str]:
        return [c for c in device.commands if " && rmdir -- " in c]

    remove(device, str(store), [f"{b}/c" for b in names_joined_to(room)], timeout=9)
    assert len(rmdirs()) == 1 and len(rmdirs()[0]) == COMMAND_BYTES - 1
    device.commands.clear()
    remove(device, str(store), [f"{b}/c" for b in names_joined_to(room + 1)], timeout=9)
    assert len(rmdirs()) == 2 and all(len(c) <= COMMAND_BYTES for c in rmdirs())


# -- what to push, and pushing it ------------------------------------------------------------------


def test_new_batch_is_a_plain_name_unique_from_one_call_to_the_next():
    a, b = new_batch(), new_batch()
    assert a != b and a.startswith("b") and a.endswith(f"{os.getpid():x}")
    assert "/" not in a and PARTIAL_SUFFIX not in a


def test_missing_lists_each_chunk_the_store_lacks_or_holds_at_another_size_once(tmp_path):
    x, y, z = b"x" * 4, b"y" * 5, b"z" * 6
    one = plan_of(tmp_path / "one", [x, y, x])
    two = plan_of(tmp_path / "two", [z, y, x])
    stored = {sha(x): Stored(4, 0, "b/x"), sha(y): Stored(2, 0, "b/y")}
    assert missing([one, two], stored) == {sha(y): (one, one.chunks[1]), sha(z): (two, two.chunks[0])}


def test_a_slice_gives_its_bytes_then_nothing_and_raises_the_given_error_once_cancelled():
    cancel = threading.Event()
    piece = _Slice(memoryview(b"abcdefg")[1:6], cancel, Cancelled)
    buf = bytearray(3)
    assert piece.readinto(buf) == 3 and bytes(buf) == b"bcd"
    assert piece.readinto(buf) == 2 and bytes(buf[:2]) == b"ef"
    assert piece.readinto(buf) == 0
    cancel.set()
    with pytest.raises(Cancelled):
        piece.readinto(buf)


def test_push_chunks_puts_the_wanted_chunks_into_a_new_batch_and_learns_where_they_are(
        device, store, tmp_path):
    a, b, c = b"a" * 3000, b"b" * 5000, b"c" * 7000
    one = plan_of(tmp_path / "one.bin", [a, b, a])
    two = plan_of(tmp_path / "two.bin", [c, b])
    stored: dict[str, Stored] = {}
    wanted = missing([one, two], stored)
    seen: list[tuple[str, int]] = []
    lock = threading.Lock()

    def on_bytes(name: str, n: int) -> None:
        with lock:
            seen.append((name, n))

    before = int(time.time())
    push_all(device, str(store), wanted, stored, on_bytes=on_bytes, timeout=7.0)
    assert not [t for t in threading.enumerate() if t.name.startswith("chunk-push")]  # none left running
    after = int(time.time())
    assert sorted(stored) == sorted([sha(a), sha(b), sha(c)])
    batches = {s.path.partition("/")[0] for s in stored.values()}
    assert len(batches) == 1 and PARTIAL_SUFFIX not in batches.copy().pop()
    for digest, data in ((sha(a), a), (sha(b), b), (sha(c), c)):
        s = stored[digest]
        assert s.size == len(data) and s.path.endswith(f"/{digest}")
        assert isinstance(s.mtime, int) and before <= s.mtime <= after
        assert (store / s.path).read_bytes() == data
    assert [p.name for p in store.iterdir()] == [batches.pop()]  # no partial batch left
    assert sorted(seen) == sorted([("one.bin", 3000), ("one.bin", 5000), ("two.bin", 7000)])
    assert all(kw["timeout"] == 7.0 for _, kw in device.push_calls)
    assert all(PARTIAL_SUFFIX in posixpath.dirname(remote) for remote, _ in device.push_calls)
    assert all(t.startswith("chunk-push_") for t in device.push_threads)
    ((rename, kw),) = device.shell_calls
    assert " && mv -- " in rename and kw == {"timeout": 7.0, "check": True}


def test_push_chunks_with_nothing_wanted_sends_nothing(device, store):
    stored = {"s": Stored(1, 1, "b/s")}
    push_all(device, str(store), {}, stored)
    assert device.commands == [] and device.pushes == [] and stored == {"s": Stored(1, 1, "b/s")}


def test_push_chunks_pushes_file_by_file_in_offset_order(device, store, tmp_path, monkeypatch):
    monkeypatch.setattr(chunkstore, "CHUNKS_IN_FLIGHT", 1)  # one at a time: the order is the device's
    pieces = [bytes([i]) * (100 + i) for i in range(4)]  # their digests are not in offset order
    one = plan_of(tmp_path / "a.bin", pieces[:2])
    two = plan_of(tmp_path / "b.bin", pieces[2:])
    wanted = dict(reversed(list(missing([two, one], {}).items())))
    stored: dict[str, Stored] = {}
    push_all(device, str(store), wanted, stored)
    in_order = [sha(p) for p in pieces]
    assert sorted(in_order) != in_order
    assert [posixpath.basename(r) for r in device.pushes] == in_order
    assert list(stored) == in_order


def test_push_chunks_runs_at_most_chunks_in_flight_pushes_at_once(device, store, tmp_path, monkeypatch):
    workers: list[int] = []

    class Pool(chunkstore.ThreadPoolExecutor):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            workers.append(self._max_workers)

    monkeypatch.setattr(chunkstore, "ThreadPoolExecutor", Pool)
    many = plan_of(tmp_path / "many", [bytes([i]) * 10 for i in range(chunkstore.CHUNKS_IN_FLIGHT + 3)])
    few = plan_of(tmp_path / "few", [b"p" * 10, b"q" * 10])
    push_all(device, str(store), missing([many], {}), {})
    push_all(device, str(store), missing([few], {}), {})
    assert workers == [chunkstore.CHUNKS_IN_FLIGHT, 2]


def test_push_chunks_raises_the_device_error_when_the_batch_cannot_be_renamed(tmp_path):
    device = RecordingDevice(tmp_path / "phone", programs={"mv": "#!/bin/sh\necho mv refused >&2\nexit 1\n"})
    plan = plan_of(tmp_path / "f", [b"x" * 10])
    stored: dict[str, Stored] = {}
    with pytest.raises(AdbError, match="mv refused") as e:
        push_all(device, store_dir(device), missing([plan], {}), stored)
    assert e.value.serial == "fake-1"
    assert stored == {}


def test_push_chunks_cancelled_before_a_byte_raises_the_callers_error_and_learns_nothing(
        device, store, tmp_path):
    plan = plan_of(tmp_path / "f", [b"x" * 10, b"y" * 10])
    cancel = threading.Event()
    cancel.set()
    stored: dict[str, Stored] = {}
    with pytest.raises(Cancelled):
        push_all(device, str(store), missing([plan], {}), stored, cancel=cancel)
    assert stored == {}
    assert not list(store.glob(f"*{PARTIAL_SUFFIX}"))  # what was begun is renamed in, cut short


class FailingPartWay(FakeDevice):
    """The first chunk's push fails once three others have started; those finish once the push is
    cancelled; any begun after that reads a cancelled chunk."""

    def __init__(self, root, first: str, cancel: threading.Event):
        super().__init__(root)
        self.first = first
        self.cancel = cancel
        self.started: list[str] = []
        self.arrived: list[str] = []
        self.cond = threading.Condition()

    def push(self, src, remote, **kwargs):
        name = posixpath.basename(remote)
        with self.cond:
            self.started.append(name)
            self.cond.notify_all()
        if name == self.first:
            with self.cond:
                assert self.cond.wait_for(lambda: len(self.started) >= 4, timeout=10)
            raise AdbError(f"device {self.serial}: push of {name} broke", serial=self.serial)
        data = bytearray()
        buf = bytearray(4096)
        while n := src.readinto(buf):
            data += buf[:n]
        assert self.cancel.wait(timeout=10)
        total = super().push(io.BytesIO(bytes(data)), remote, **kwargs)
        with self.cond:
            self.arrived.append(name)
        return total


def test_a_push_that_fails_part_way_keeps_the_chunks_that_arrived_and_raises_its_error(tmp_path):
    cancel = threading.Event()
    pieces = [bytes([i]) * (50 + i) for i in range(16)]
    plan = plan_of(tmp_path / "f", pieces)
    device = FailingPartWay(tmp_path / "phone", sha(pieces[0]), cancel)
    store = Path(store_dir(device))
    stored = {"e" * 64: Stored(1, 1, "old/" + "e" * 64)}
    with pytest.raises(AdbError, match="broke"):
        push_all(device, str(store), missing([plan], {}), stored, cancel=cancel)
    assert len(device.arrived) >= 3
    assert set(stored) == set(device.arrived) | {"e" * 64}
    for piece in pieces[1:]:
        if sha(piece) in stored:
            assert (store / stored[sha(piece)].path).read_bytes() == piece
    assert len(device.started) < len(pieces)  # the chunks not begun were not pushed at all
    assert not list(store.glob(f"*{PARTIAL_SUFFIX}"))


def test_a_failed_push_whose_batch_cannot_be_renamed_says_so_and_raises_the_push_error(tmp_path, caplog):
    class Broken(FakeDevice):
        def push(self, src, remote, **kwargs):
            raise AdbError(f"device {self.serial}: push broke", serial=self.serial)

    device = Broken(tmp_path / "phone", programs={"mv": "#!/bin/sh\necho mv refused >&2\nexit 1\n"})
    plan = plan_of(tmp_path / "f", [b"x" * 10])
    os.makedirs(store_dir(device))
    caplog.set_level(logging.INFO, logger=LOGGER)
    stored: dict[str, Stored] = {}
    with pytest.raises(AdbError, match="push broke"):
        push_all(device, store_dir(device), missing([plan], {}), stored)
    assert stored == {}
    (record,) = [r for r in caplog.records if r.name == LOGGER]
    assert record.levelno == logging.INFO
    assert record.args[0] == "fake-1" and isinstance(record.args[1], AdbError)
    assert record.getMessage() == f"device fake-1: chunks of a failed push not kept: {record.args[1]}"
    assert "mv refused" in record.getMessage()


# -- assembling and checking --------------------------------------------------------------------


def stored_in(device, store: Path, plan: FileChunks, batch: str = "b1",
              mtime: int = 1000) -> dict[str, Stored]:
    for c in plan.unique().values():
        with open(plan.path, "rb") as f:
            f.seek(c.offset)
            put(store, f"{batch}/{c.sha256}", f.read(c.size), mtime=mtime)
    found, _ = parse_listing(device.shell(listing_command(str(store)), timeout=5).out)
    return found


def test_assemble_writes_the_chunks_in_order_and_reports_the_digest_and_mtime(device, store, tmp_path):
    a, b = b"a" * 300, b"b" * 200
    plan = plan_of(tmp_path / "f.bin", [a, b, a])
    stored = stored_in(device, store, plan)
    target = posixpath.join(device.workspace, "my dir", "f.bin" + PARTIAL_SUFFIX)
    os.makedirs(os.path.dirname(target))
    device.push_calls.clear()
    device.shell_calls.clear()
    before = int(time.time())
    digest, mtime = assemble(device, str(store), plan, stored, target, timeout=3, hash_timeout=11)
    assert digest == plan.sha256
    assert Path(target).read_bytes() == a + b + a
    assert mtime == int(os.stat(target).st_mtime) and mtime >= before
    assert [remote for remote, _ in device.push_calls] == [target + ".chunks"]
    assert device.push_calls[0][1] == {"timeout": 3}
    assert not [p for p in Path(device.workspace).rglob("*.chunks")]  # the list file is left nowhere
    ((command, kw),) = device.shell_calls
    assert kw == {"timeout": 11} and "-d @" not in command
    assert all(os.stat(store / s.path).st_mtime >= before for s in stored.values())  # the LRU clock


def test_assemble_reads_the_mtime_of_a_target_whose_name_holds_its_marker(device, store, tmp_path):
    # sha256sum prints the target's name before the stat marker: a name is data, not a marker.
    plan = plan_of(tmp_path / "f", [b"q" * 10])
    stored = stored_in(device, store, plan)
    target = posixpath.join(device.workspace, "x@@stat.bin" + PARTIAL_SUFFIX)
    assert assemble(device, str(store), plan, stored, target, timeout=3, hash_timeout=3,
                    mtime=1234567) == (plan.sha256, 1234567)


def test_assemble_sets_the_given_mtime_even_a_negative_one(device, store, tmp_path):
    plan = plan_of(tmp_path / "f", [b"q" * 10])
    stored = stored_in(device, store, plan)
    target = posixpath.join(device.workspace, "f" + PARTIAL_SUFFIX)
    assert assemble(device, str(store), plan, stored, target, timeout=13, hash_timeout=2,
                    mtime=-5) == (plan.sha256, -5)
    assert os.stat(target).st_mtime == -5
    assert device.shell_calls[-1][1] == {"timeout": 13}


def test_assemble_with_a_chunk_the_store_never_had_gives_a_wrong_digest_not_an_error(device, store, tmp_path):
    plan = plan_of(tmp_path / "f", [b"q" * 10, b"r" * 10])
    stored = stored_in(device, store, plan)
    del stored[sha(b"r" * 10)]
    target = posixpath.join(device.workspace, "f" + PARTIAL_SUFFIX)
    digest, _ = assemble(device, str(store), plan, stored, target, timeout=3, hash_timeout=3)
    assert digest == sha(b"q" * 10)


@pytest.mark.parametrize("sha256sum, stat", [("exit 1", "exit 1"), ("echo short  x", "echo soon")],
                         ids=["silent", "garbled"])
def test_assemble_without_a_digest_or_stamp_from_the_device_reports_none_and_zero(tmp_path, sha256sum, stat):
    device = FakeDevice(tmp_path / "phone", programs={"sha256sum": f"#!/bin/sh\n{sha256sum}\n",
                                                      "stat": f"#!/bin/sh\n{stat}\n"})
    plan = plan_of(tmp_path / "f", [b"q" * 10])
    store = Path(store_dir(device))
    put(store, f"b1/{sha(b'q' * 10)}", b"q" * 10)
    stored = {sha(b"q" * 10): Stored(10, 0, f"b1/{sha(b'q' * 10)}")}
    target = posixpath.join(device.workspace, "f" + PARTIAL_SUFFIX)
    assert assemble(device, str(store), plan, stored, target, timeout=3, hash_timeout=3) == (None, 0)


def test_device_digests_hashes_the_named_files_and_leaves_the_missing_ones_out(device):
    root = Path(device.workspace)
    (root / "a b").write_bytes(b"1")
    (root / "c").write_bytes(b"2")
    assert device_digests(device, str(root), ["a b", "gone", "c"], timeout=4) == {"a b": sha(b"1"),
                                                                                 "c": sha(b"2")}
    assert [kw for _, kw in device.shell_calls] == [{"timeout": 4}]


def test_device_digests_fills_each_command_up_to_the_bound_and_no_further(device):
    room = COMMAND_BYTES - len(f"cd {shlex.quote(device.workspace)} && sha256sum --") - 1
    assert device_digests(device, device.workspace, names_joined_to(room), timeout=4) == {}
    assert [len(c) for c in device.commands] == [COMMAND_BYTES]
    device.commands.clear()
    device_digests(device, device.workspace, names_joined_to(room + 1), timeout=4)
    assert len(device.commands) == 2 and all(len(c) <= COMMAND_BYTES for c in device.commands)


def test_damaged_finds_removes_and_forgets_the_chunks_whose_bytes_are_wrong(device, store, tmp_path):
    good, bad, never = b"g" * 10, b"b" * 10, b"n" * 10
    plan = plan_of(tmp_path / "f", [good, bad, never, good])
    put(store, f"b1/{sha(good)}", good)
    put(store, f"b2/{sha(bad)}", b"B" * 10)  # altered in place, same size
    stored = {sha(good): Stored(10, 1, f"b1/{sha(good)}"), sha(bad): Stored(10, 1, f"b2/{sha(bad)}"),
              "f" * 64: Stored(3, 1, "b1/" + "f" * 64)}
    assert damaged(device, str(store), plan, stored, timeout=6) == {sha(bad), sha(never)}
    assert stored == {sha(good): Stored(10, 1, f"b1/{sha(good)}"), "f" * 64: Stored(3, 1, "b1/" + "f" * 64)}
    assert sorted(str(p.relative_to(store)) for p in store.rglob("*")) == ["b1", f"b1/{sha(good)}"]
    assert {kw["timeout"] for _, kw in device.shell_calls} == {6}


def test_assembled_wrong_is_the_devices_error_naming_it_and_both_digests(device):
    e = assembled_wrong(device, "model.pte", "ab" * 32, "cd" * 32)
    assert isinstance(e, AdbError) and e.serial == "fake-1"
    assert str(e) == (f"device fake-1: model.pte assembled from chunks that hash right has sha256 "
                      f"{'ab' * 32}, expected {'cd' * 32}: the device does not keep what it is given")
    e = assembled_wrong(device, "model.pte", None, "cd" * 32)
    assert str(e) == (f"device fake-1: model.pte assembled from chunks that hash right has sha256 "
                      f"unknown, expected {'cd' * 32}: the device does not keep what it is given")


# -- keeping the store bounded -----------------------------------------------------------------------


def lru_store(device, store: Path) -> dict[str, Stored]:
    """Four chunks of 10, 20, 30 and 40 bytes whose names sort opposite to their age."""
    stored = {}
    for i, (name, mtime) in enumerate((("d" * 64, 100), ("c" * 64, 200), ("b" * 64, 300), ("a" * 64, 400))):
        size = 10 * (i + 1)
        put(store, f"b{i % 2}/{name}", b"x" * size, mtime=mtime)
        stored[name] = Stored(size, mtime, f"b{i % 2}/{name}")
    return stored


def test_evict_removes_the_least_recently_used_first_and_never_a_protected_chunk(device, store):
    stored = lru_store(device, store)
    # 100 bytes, down to 55: "d" (oldest) is protected, so "c" then "b" go, and "a" (newest) stays.
    assert evict(device, str(store), stored, {"d" * 64}, 55, timeout=8) == (2, 50)
    assert sorted(stored) == ["a" * 64, "d" * 64]
    assert sorted(p.name for p in store.rglob("*") if p.is_file()) == ["a" * 64, "d" * 64]
    assert {tuple(kw.items()) for _, kw in device.shell_calls} >= {(("timeout", 8), ("check", True))}


def test_evict_stops_as_soon_as_the_store_fits_exactly(device, store):
    stored = lru_store(device, store)
    assert evict(device, str(store), stored, set(), 90, timeout=8) == (1, 10)
    assert sorted(stored) == ["a" * 64, "b" * 64, "c" * 64]
    stored = lru_store(device, store)
    assert evict(device, str(store), stored, set(), 89, timeout=8) == (2, 30)
    assert sorted(stored) == ["a" * 64, "b" * 64]


def test_evict_breaks_a_tie_of_age_by_name(device, store):
    stored = {n: Stored(5, 7, f"b/{n}") for n in ("e" * 64, "a" * 64, "c" * 64)}
    assert evict(device, str(store), stored, set(), 5, timeout=8) == (2, 10)
    assert list(stored) == ["e" * 64]


def test_evict_removes_nothing_when_the_store_fits_and_all_it_can_when_protected_ones_are_left(device, store):
    stored = lru_store(device, store)
    assert evict(device, str(store), stored, set(), 100, timeout=8) == (0, 0)
    assert len(stored) == 4 and device.commands == []
    assert evict(device, str(store), stored, {"a" * 64, "b" * 64}, 0, timeout=8) == (2, 30)
    assert sorted(stored) == ["a" * 64, "b" * 64]


def write_record(device, bundle: str, body: str, name: str = "record.json") -> None:
    path = Path(device.workspace) / bundle / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)


def test_referenced_collects_every_chunk_the_deploy_records_list_and_ignores_odd_entries(device):
    write_record(device, "one", '{"files": {"a": {"chunks": ["s1", "s2"]}, "b": {"sha256": "x"}}}')
    write_record(device, "two", '{"files": {"c": {"chunks": ["s3", 4]}, "d": "s9", "e": {"chunks": "s8"}}}')
    write_record(device, "three", '{"files": ["s7"]}')
    write_record(device, "four", '{"bundle": "no files"}')
    write_record(device, "five", '{"files": {"f": {"chunks": ["s4"]}}}', name="other.json")
    assert referenced(device, "record.json", timeout=12) == {"s1", "s2", "s3"}
    assert [kw for _, kw in device.shell_calls] == [{"timeout": 12, "check": True}]


def test_referenced_of_a_device_without_records_is_empty(device):
    assert referenced(device, "record.json", timeout=12) == set()


@pytest.mark.parametrize("body", ["not json", "[1, 2]"])
def test_referenced_is_none_for_an_unreadable_record_and_says_so(device, caplog, body):
    write_record(device, "one", '{"files": {"a": {"chunks": ["s1"]}}}')
    write_record(device, "two", body)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    assert referenced(device, "record.json", timeout=12) is None
    assert [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOGGER] == [
        (logging.WARNING, "device fake-1: an unreadable deploy record, nothing evicted")]


def test_referenced_is_none_when_the_records_cannot_be_read_and_says_why(tmp_path, caplog):
    class Unreachable(FakeDevice):
        def shell(self, command, **kwargs):
            raise DeviceTimeout(f"device {self.serial}: command did not finish", serial=self.serial)

    device = Unreachable(tmp_path / "phone", serial="lost-3")
    caplog.set_level(logging.WARNING, logger=LOGGER)
    assert referenced(device, "record.json", timeout=12) is None
    (record,) = [r for r in caplog.records if r.name == LOGGER]
    assert record.levelno == logging.WARNING
    assert record.args[0] == "lost-3" and isinstance(record.args[1], DeviceTimeout)
    assert record.getMessage() == (f"device lost-3: cannot read the deploy records, nothing evicted: "
                                   f"{record.args[1]}")
    assert "device lost-3" in str(record.args[1])


def test_referenced_is_none_when_the_workspace_cannot_be_entered(tmp_path):
    class Moved(FakeDevice):  # its workspace is not there: no record can be read, none vouched for
        @property
        def workspace(self) -> str:
            return str(self.root / "gone")

    assert referenced(Moved(tmp_path / "phone"), "record.json", timeout=12) is None


def test_chunk_stats_to_dict_is_every_figure_but_the_chunk_lists():
    stats = ChunkStats(files=1, chunks=2, chunks_pushed=3, bytes_pushed=4, fallback="full",
                       chunk_lists={"f": ["s"]})
    d = stats.to_dict()
    assert d == {"files": 1, "chunks": 2, "chunks_pushed": 3, "bytes_pushed": 4, "chunks_reused": 0,
                 "bytes_reused": 0, "chunks_repaired": 0, "chunks_evicted": 0, "bytes_evicted": 0,
                 "fallback": "full", "seconds_chunking": 0.0, "seconds_pushing": 0.0,
                 "seconds_assembling": 0.0}
    assert stats.chunk_lists == {"f": ["s"]}
