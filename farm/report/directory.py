"""A run's report directory, written atomically: JUnit, the Markdown summary, results.json.

Layout::

    junit/<device>.xml   one <testsuite> per device; tests that never got a device: unleased-<SoC>.xml
    summary.md           verdict first, then one row per test
    results.json         meta + every record with its attempts and measurements (farm.results.jsonfile)

Only ``junit/`` holds XML, so a CI glob of ``junit/*.xml`` (or ``**/*.xml``) counts every test once.
The directory is written under a temporary name and renamed into place: a crash never leaves half a
report where CI looks. A run that died before writing it is recovered from its journal.

Before any device is leased the directory is checked (``check_out_dir``: it exists or its parent does,
a file can be written there, the file system has room for the reports) and locked (``lock_out_dir``):
one run at a time writes a report directory and its journal. A report that cannot be written where
it was asked for at the end (the file system filled during the run) goes to ``fallback_dir``.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm.errors import UsageError
from farm.fileio import write_atomic
from farm.report.junit import device_key, junit_suite, safe_file_name
from farm.report.markdown import summary_markdown
from farm.results.jsonfile import results_json
from farm.results.records import (
    UNITS,
    ResultLog,
    TestRecord,
    journal_paths,
    set_aside_paths,
    tool_version,
    verdict,
)

# Room a run's reports need on the report directory's file system before it starts: the report
# directory, report.html (inline SVG plots) and report.md of a large qualification are a few MB, the
# journal and the staging copy as much again. A file system with less is refused up front rather than
# filled mid-run.
REPORT_SPACE_BYTES = 16 * 2**20


def complete_meta(records: list[TestRecord], meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` with what every written run carries (verdict, purpose, tool version, units), as
    results.json and the results store both keep it."""
    meta = dict(meta)
    meta.setdefault("verdict", verdict(records, interrupted=bool(meta.get("partial"))).value)
    meta.setdefault("purpose", "adhoc")
    meta.setdefault("written_at", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    meta.setdefault("tool_version", tool_version())
    meta.setdefault("units", dict(UNITS))
    return meta


def write_reports(records: list[TestRecord], out_dir: Path, meta: dict[str, Any]) -> Path:
    """Write the report directory atomically (replacing an older one) and return its path."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # Where this copy is written is for the JUnit's attachment paths only: the run itself (results.json,
    # the results store) is the same wherever its report lands.
    report_dir = meta.get("report_dir")
    meta = complete_meta(records, {k: v for k, v in meta.items() if k != "report_dir"})
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        by_device: dict[str, list[TestRecord]] = {}
        for r in records:
            by_device.setdefault(device_key(r), []).append(r)
        (staging / "junit").mkdir()
        for device, rows in sorted(by_device.items()):
            tree = ET.ElementTree(junit_suite(device, rows, {**meta, "report_dir": report_dir}
                                              if report_dir else meta))
            ET.indent(tree)
            tree.write(staging / "junit" / f"{safe_file_name(device)}.xml", encoding="utf-8",
                       xml_declaration=True)
        (staging / "summary.md").write_text(summary_markdown(records, meta), encoding="utf-8")
        (staging / "results.json").write_text(results_json(records, meta), encoding="utf-8")
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.rename(out_dir, old)
            os.rename(staging, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def check_out_dir(out_dir: Path, *, make_parents: bool = False,
                  space_bytes: int = REPORT_SPACE_BYTES) -> None:
    """A UsageError naming ``out_dir`` unless a run can write its report there: the directory is a
    directory or can be made in its parent (which must exist, unless ``make_parents``: a typo in a
    path given on the command line should not make a tree somewhere), files can be written beside it
    (journal, staging copy) and in it, and the file system has ``space_bytes`` free."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"report directory {out_dir}: exists and is not a directory")
    parent = out_dir.absolute().parent
    if make_parents:
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"report directory {out_dir}: cannot make {parent}: {e.strerror}") from None
    if not parent.is_dir():
        raise UsageError(f"report directory {out_dir}: its parent directory {parent} does not exist")
    for where in (parent, out_dir) if out_dir.is_dir() else (parent,):
        try:
            fd, probe = tempfile.mkstemp(prefix=".ptefarm-probe-", dir=where)
            try:
                os.write(fd, b"ptefarm")
            finally:
                os.close(fd)
                os.unlink(probe)
        except OSError as e:
            raise UsageError(f"report directory {out_dir}: cannot write in {where}: {e.strerror}") from None
    free = shutil.disk_usage(parent).free
    if free < space_bytes:
        raise UsageError(f"report directory {out_dir}: {free / 2**20:.1f} MiB free on its file system, "
                         f"a run's reports need {space_bytes / 2**20:.0f} MiB")


# Locks this process holds, by lock file: `farm qualify` holds its --out's for the whole command and the
# plugin, in the same process, takes it again (flock would refuse a second open file of one process).
_HELD: dict[Path, list] = {}


def lock_path(out_dir: Path) -> Path:
    out_dir = Path(out_dir).absolute()
    return out_dir.parent / f".{out_dir.name}.lock"


@contextlib.contextmanager
def lock_out_dir(out_dir: Path, run_id: str = "") -> Iterator[None]:
    """Hold ``out_dir`` for one run: a second run (any process, this host or another sharing the file
    system and its locks) is refused with a UsageError naming the holder (pid, host, run id).

    An flock on ``.<out>.lock`` beside it: the kernel drops it when its holder dies however it dies, so
    a killed run never leaves the directory locked. The file says who holds it."""
    path = lock_path(out_dir)
    held = _HELD.get(path)
    if held is not None:  # this process holds it already: count, and name the run once it has an id
        held[1] += 1
        if run_id:
            _write_holder(held[0], run_id)
        try:
            yield
        finally:
            held[1] -= 1
        return
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise UsageError(f"report directory {out_dir}: cannot make its lock {path}: "
                             f"{e.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode("utf-8", "replace").strip() or "a run that has not said who"
            os.close(fd)
            raise UsageError(f"report directory {out_dir}: in use by another run ({holder}); give this "
                             "run another --out, or wait for that one to end") from None
        # A holder that was releasing may have unlinked the file this process opened: lock the file
        # that is at the path, not a removed one.
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    _HELD[path] = held = [fd, 1]
    try:
        _write_holder(fd, run_id)
        yield
    finally:
        held[1] -= 1
        if held[1] == 0:  # the outermost holder in this process lets go
            del _HELD[path]
            with contextlib.suppress(OSError):
                path.unlink()
            os.close(fd)


def _write_holder(fd: int, run_id: str) -> None:
    text = f"pid {os.getpid()} on {socket.gethostname()}" + (f", run {run_id}" if run_id else "")
    with contextlib.suppress(OSError):  # who holds it is a courtesy; the lock is the flock
        os.ftruncate(fd, 0)
        os.pwrite(fd, text.encode() + b"\n", 0)


def fallback_dir(out_dir: Path, run_id: str) -> Path:
    """Where a run's report goes when ``out_dir`` cannot take it at the end (its file system filled
    during the run): the system's temporary directory ($TMPDIR), most often another file system."""
    name = f"{Path(out_dir).name or 'report'}-{run_id or time.strftime('%Y%m%d-%H%M%S')}"
    return Path(tempfile.gettempdir()) / "ptefarm-reports" / name


def _safe_id(run_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", run_id)[:100] or "unknown"


def set_aside_journal(out_dir: Path) -> str | None:
    """Move the journal a killed run left beside ``out_dir`` out of the way of a new run (which holds
    the directory's lock, so the writer of that journal is gone) under its run id; that id, or None
    when there was none."""
    log_path, meta_path = journal_paths(out_dir)
    if not log_path.exists() and not meta_path.exists():
        return None
    try:
        run_id = str(json.loads(meta_path.read_text())["run_id"])
    except (OSError, ValueError, KeyError, TypeError):
        ids = [i for i in ResultLog.read_runs(log_path) if i]
        run_id = ids[0] if ids else time.strftime("unknown-%Y%m%d-%H%M%S")
    aside_log, aside_meta = set_aside_paths(out_dir, _safe_id(run_id))
    for src, dst in ((log_path, aside_log), (meta_path, aside_meta)):
        if src.exists():
            os.replace(src, dst)
    return run_id


@dataclass
class _Journal:
    log: Path
    meta: Path
    meta_body: dict[str, Any]
    runs: dict[str | None, list[TestRecord]]


def _journals(out_dir: Path) -> list[_Journal]:
    log_path, meta_path = journal_paths(out_dir)
    pairs = [(log_path, meta_path)]
    for aside in sorted(log_path.parent.glob(glob.escape(log_path.name) + ".*")):
        run_id = aside.name[len(log_path.name) + 1:]
        pairs.append(set_aside_paths(out_dir, run_id))
    found = []
    for log, meta in pairs:
        if not log.exists() and not meta.exists():
            continue
        try:
            body = json.loads(meta.read_text())
            body = body if isinstance(body, dict) else {}
        except (OSError, ValueError):
            body = {}
        runs = ResultLog.read_runs(log)
        if None in runs:  # lines from before lines carried their run: the meta's run wrote them
            runs.setdefault(body.get("run_id"), []).extend(runs.pop(None))
        found.append(_Journal(log, meta, body, runs))
    return found


def recover(out_dir: Path, run_id: str | None = None) -> Path:
    """Write the report of a run that died before writing it (SIGKILL, a crash of the host) from its
    journal: every test that finished is in it; the report is marked partial. Returns where it went.

    Records of two runs are never merged: with journals of several runs beside ``out_dir``, ``run_id``
    names the one to recover. A report already in ``out_dir`` (another run's, or one written whole) is
    never replaced: the recovered one goes beside it, ``<out>.recovered-<run id>``."""
    out_dir = Path(out_dir)
    with lock_out_dir(out_dir):
        journals = _journals(out_dir)
        if not journals:
            raise UsageError(f"{out_dir}: no journal of an unfinished run here (expected "
                             f"{journal_paths(out_dir)[0]})")
        ids = sorted({i for j in journals for i in j.runs} | {j.meta_body.get("run_id") for j in journals
                                                              if j.meta_body.get("run_id")}, key=str)
        if run_id is None:
            if len(ids) > 1:
                raise UsageError(f"{out_dir}: journals of {len(ids)} runs here ({', '.join(map(str, ids))}); "
                                 "name the one to recover with --run RUN_ID")
            run_id = ids[0] if ids else None
        elif run_id not in ids:
            raise UsageError(f"{out_dir}: no journal of run {run_id} here (runs: "
                             f"{', '.join(map(str, ids)) or 'none'})")
        records = [r for j in journals for r in j.runs.get(run_id, [])]
        metas = [j.meta_body for j in journals if j.meta_body.get("run_id") == run_id]
        meta = dict(metas[0]) if metas else ({"run_id": run_id} if run_id else {})
        meta.update(partial=True, recovered=True)
        meta.pop("verdict", None)
        target = out_dir
        if (out_dir / "results.json").exists():
            target = out_dir.with_name(f"{out_dir.name}.recovered-{_safe_id(str(run_id))}")
        written = write_reports(records, target, meta)
        for j in journals:  # what is recovered leaves its journal; other runs' lines stay
            rest = {i: rs for i, rs in j.runs.items() if i != run_id}
            if rest:
                text = "".join(json.dumps({"run_id": i, **r.to_json()}, ensure_ascii=False) + "\n"
                               for i, rs in rest.items() for r in rs)
                write_atomic(j.log, text)
            else:
                j.log.unlink(missing_ok=True)
            if j.meta_body.get("run_id") == run_id or not rest:
                j.meta.unlink(missing_ok=True)
        return written
