"""A report directory is checked before a run leases anything (it exists or can be made, it can be
written, it has room) and held by one run at a time; what a user is told names the directory."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from farm.errors import UsageError
from farm.report.directory import check_out_dir, lock_out_dir, lock_path


@contextlib.contextmanager
def read_only(directory: Path):
    """``directory`` read-only for this process: by its mode, or (root ignores modes) by the
    immutable attribute, which root's writes respect too."""
    if os.geteuid() != 0:
        directory.chmod(0o555)
        try:
            yield directory
        finally:
            directory.chmod(0o755)
        return
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(directory)],
                                                        capture_output=True).returncode != 0:
        pytest.skip(f"cannot make {directory} read-only as root here (chattr +i)")
    try:
        yield directory
    finally:
        subprocess.run(["chattr", "-i", str(directory)], check=True)


def test_a_report_directory_whose_parent_is_missing_is_refused_naming_it(tmp_path):
    out = tmp_path / "no-such-dir" / "out"
    with pytest.raises(UsageError, match=f"report directory {out}: its parent directory .* does not exist"):
        check_out_dir(out)
    check_out_dir(out, make_parents=True)  # the default --out's parent (reports/) is made
    assert out.parent.is_dir() and not out.exists()


def test_a_read_only_report_directory_is_refused_naming_it(tmp_path):
    (tmp_path / "ro").mkdir()
    with read_only(tmp_path / "ro") as ro:
        with pytest.raises(UsageError, match=f"report directory {ro / 'out'}: cannot write in {ro}"):
            check_out_dir(ro / "out")
    check_out_dir(tmp_path / "ro" / "out")


def test_a_report_directory_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "out").write_text("")
    with pytest.raises(UsageError, match="exists and is not a directory"):
        check_out_dir(tmp_path / "out")


def test_a_file_system_without_room_for_the_reports_is_refused(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(UsageError, match=f"report directory {tmp_path / 'out'}: .* MiB free"):
        check_out_dir(tmp_path / "out", space_bytes=free + 2**30)
    check_out_dir(tmp_path / "out", space_bytes=1)
    assert sorted(tmp_path.iterdir()) == []  # the check leaves nothing behind


HOLD = """
import sys, time
from farm.report.directory import lock_out_dir
with lock_out_dir(sys.argv[1], "run-1"):
    print("held", flush=True)
    time.sleep(300)
"""


def test_a_second_run_on_a_held_report_directory_is_refused_naming_the_holder(tmp_path):
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UsageError, match=rf"{out}: in use by another run \(pid {holder.pid} on .*, "
                                             r"run run-1\)"):
            with lock_out_dir(out, "run-2"):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # Its holder killed, the directory is free at once (the kernel dropped the lock).
    with lock_out_dir(out, "run-2"):
        assert "run run-2" in lock_path(out).read_text()
        with lock_out_dir(out):  # this process again (farm qualify, then its plugin): no deadlock
            pass
        assert lock_path(out).exists()
    assert not lock_path(out).exists()
