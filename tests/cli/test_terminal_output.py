"""What the commands print (issue 12 item 6): whole lines when not a terminal (CI logs), and progress
reported through callbacks with sensible values (export steps, deploy bytes, lease waits)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest
from click.testing import CliRunner

from farm.bundle import manifest as bundle_mod
from farm.cli.main import main
from farm.cli.progress import LeaseWaitReporter, describe_wait
from farm.device.discovery import find_device
from farm.errors import LeaseTimeout
from farm.execute.deploy import deploy
from farm.pool import Holder, LeaseRequest, Pool
from farm.virtual import VirtualDeviceSpec, VirtualFarm
from tests.support.devices import make_qnn_bundle
from tests.support.pool import fake_device

LONG_SERIAL = "R5CW" + "0123456789" * 10 + "-a-serial-longer-than-any-terminal"
ALICE = Holder(user="alice", host="ci-3", pid=4242, purpose="nightly gate")


def _env(**extra: str) -> dict[str, str]:
    # An 80-column COLUMNS, as many CI runners export: it must not cut lines that are not a terminal's.
    return {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"COLUMNS": "80"} | extra


@pytest.fixture
def busy_pool(tmp_path):
    """A SQLite pool with two SM8650s (one with a very long serial), both leased by alice (pr)."""
    url = f"sqlite:///{tmp_path / 'pool.db'}"
    with Pool.open(url, poll_s=0.05) as pool:
        pool.sync([fake_device(LONG_SERIAL), fake_device("dev-b")])
        leases = [pool.acquire(LeaseRequest(socs=("SM8650",), priority=10), ALICE, ttl_s=600,
                               timeout_s=5) for _ in range(2)]
        yield url, pool, leases


# -- not a terminal: whole lines -----------------------------------------------------------------

def test_pool_status_keeps_a_long_serial_whole_in_a_pipe(busy_pool):
    url, _, _ = busy_pool
    done = subprocess.run([sys.executable, "-m", "farm.cli.main", "pool", "status", "--url", url],
                          capture_output=True, text=True, timeout=60, env=_env())
    assert done.returncode == 0, done.stderr
    assert LONG_SERIAL in done.stdout  # whole, on one line
    assert "…" not in done.stdout and "\x1b[" not in done.stdout  # no ellipsis, no colour codes
    line = next(x for x in done.stdout.splitlines() if LONG_SERIAL in x)
    assert "alice@ci-3" in line  # the row is not wrapped onto a second line either
    assert max(len(x) for x in done.stdout.splitlines()) < 1000  # not padded to the huge width


@pytest.fixture(scope="module")
def cli_devices(tmp_path_factory):
    root = tmp_path_factory.mktemp("term")
    with VirtualFarm(home=root / "home") as vf:
        (record,) = vf.up([VirtualDeviceSpec(soc="SM8650")])
        config = root / "farm.toml"
        config.write_text(f'[farm]\nhome = "{root / "home"}"\n\n'
                          f'[[adb_servers]]\nhost = "127.0.0.1"\nport = {vf.adb_server.port}\n')
        device = find_device([vf.adb_server], record.serial)
        yield config, device


def test_devices_table_in_a_pipe_is_not_cut_at_80_columns(cli_devices):
    config, device = cli_devices
    info = device.info()
    done = subprocess.run([sys.executable, "-m", "farm.cli.main", "devices", "--config", str(config)],
                          capture_output=True, text=True, timeout=60, env=_env())
    assert done.returncode == 0, done.stderr
    row = next(x for x in done.stdout.splitlines() if device.serial in x)
    assert info.model and info.model.startswith("SM-") and info.model in row.split()  # not "SM-S…"
    assert "…" not in done.stdout


def test_deploy_in_a_pipe_prints_plain_lines_with_whole_paths(cli_devices, tmp_path):
    config, device = cli_devices
    manifest = make_qnn_bundle(tmp_path / "b", name="term-" + "x" * 90)
    done = subprocess.run([sys.executable, "-m", "farm.cli.main", "deploy", str(manifest), "--serial",
                           device.serial, "--config", str(config)],
                          capture_output=True, text=True, timeout=120, env=_env())
    assert done.returncode == 0, done.stderr
    assert "farm deploy: pushing" in done.stderr and device.serial in done.stderr
    assert f"{device.workspace}/term-{'x' * 90}\n" in done.stdout  # the summary's path, whole
    assert "\r" not in done.stderr and "\x1b[" not in done.stderr  # no bar drawn into the log


# -- progress callbacks ---------------------------------------------------------------------------

def test_deploy_reports_the_plan_then_every_byte(cli_devices, tmp_path):
    _, device = cli_devices
    bundle = bundle_mod.load(make_qnn_bundle(tmp_path / "p", name="progress", pte_bytes=3 << 20))
    plans: list[int] = []
    sent: dict[str, int] = {}
    report = deploy(device, bundle, on_plan=plans.append,
                    on_progress=lambda name, n: sent.__setitem__(name, sent.get(name, 0) + n))
    sizes = {f.name: f.size for f in bundle.files_for(device.htp_arch)}
    assert plans == [sum(sizes.values())] == [report.bytes_pushed]
    assert sent == sizes  # per file, exactly its size
    again_plans: list[int] = []
    again: list[tuple[str, int]] = []
    deploy(device, bundle, on_plan=again_plans.append, on_progress=lambda *a: again.append(a))
    assert again_plans == [0] and again == []  # nothing to push, nothing reported


def test_export_reports_its_steps_in_order(tmp_path, monkeypatch):
    from farm.bundle import export

    # The lowering itself is torch.export + XNNPACK (tests/bundle/test_export.py runs it); here only the
    # steps around it matter.
    lowered: list[list[int]] = []
    monkeypatch.setattr(export, "_lower_ar_lens",
                        lambda weights, ar_lens, metadata: lowered.append(ar_lens) or "lowered")
    monkeypatch.setattr(export, "_write_program",
                        lambda lowered, methods, metadata, path: path.write_bytes(repr(methods).encode()))
    steps: list[tuple[str, int, int]] = []
    manifest = export.export_bundle("tiny", tmp_path / "exports",
                                    on_step=lambda *s: steps.append(s))
    assert manifest.is_file()
    assert steps == [(what, i, 4) for i, what in enumerate(export.STEPS, 1)]
    assert [what for what, _, _ in steps][1] == "lowering the model to XNNPACK"
    # every distinct ar_len lowered once, in one call: tiny's decode (1); its prefill and its
    # lookahead decode ((4 + 4) * (3 - 1) = 16 rows) share one
    assert lowered == [[1, 16]]
    cached: list[tuple] = []
    assert export.export_bundle("tiny", tmp_path / "exports", on_step=lambda *s: cached.append(s)) \
        == manifest
    assert cached == []  # a cache hit has no steps


def test_lease_wait_calls_back_with_the_time_waited(busy_pool):
    _, pool, _ = busy_pool
    waited: list[float] = []
    started = time.monotonic()
    with pytest.raises(LeaseTimeout):
        pool.acquire(LeaseRequest(socs=("SM8650",)), timeout_s=3.0, on_wait=waited.append)
    elapsed = time.monotonic() - started
    assert len(waited) >= 2  # every poll while it waits (about one a second with pushed grants)
    assert waited == sorted(waited) and 0 <= waited[0] < 0.5 and waited[-1] <= elapsed


def test_wait_description_names_the_holder_its_priority_and_hold_time(busy_pool):
    _, pool, _ = busy_pool
    status = pool.status()
    later = replace(status, now=status.now + 40)
    text = describe_wait(later, LeaseRequest(socs=("SM8650",)), 12.4)
    assert text == "waiting 12 s for SoC SM8650: both held by alice@ci-3 (pr, 40 s)"
    one = describe_wait(later, LeaseRequest(serial="dev-b"), 3)
    assert one == "waiting 3 s for serial dev-b: held by alice@ci-3 (pr, 40 s)"
    assert describe_wait(later, LeaseRequest(socs=("SM8750",)), 1).endswith("no device in the pool "
                                                                           "matches yet")


def test_lease_wait_in_a_log_is_plain_lines_that_do_not_repeat(busy_pool):
    _, pool, _ = busy_pool
    log = io.StringIO()
    reporter = LeaseWaitReporter(pool.status, LeaseRequest(socs=("SM8650",)), stream=log,
                                 refresh_s=0.0)
    with pytest.raises(LeaseTimeout):
        # 5 s: the pool calls back about once a second; a loaded host must still see one call.
        pool.acquire(LeaseRequest(socs=("SM8650",)), timeout_s=5.0, on_wait=reporter)
    lines = log.getvalue().splitlines()
    assert lines == ["farm: " + reporter.shown[0]]  # said once: who holds them did not change
    assert "both held by alice@ci-3 (pr, " in lines[0] and "\r" not in log.getvalue()


def test_farm_pool_lease_says_whom_it_waits_for(busy_pool):
    url, _, _ = busy_pool
    done = CliRunner().invoke(main, ["pool", "lease", "--url", url, "--soc", "SM8650",
                                     "--timeout", "5"], env=_env())
    assert done.exit_code == 3  # no device in time: infrastructure
    assert any(f"farm: waiting {n} s for SoC SM8650: both held by alice@ci-3 (pr, " in done.stderr
               for n in range(1, 6))
    assert "no device for request" in done.stderr
