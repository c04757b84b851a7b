"""`farm deploy` and `farm run` on a pool device need its lease (issue 10, item 2), on both backends.

A virtual SM8650 behind a real adb server; the pool knows it. A device the pool does not know works
as before (tests/cli/test_devices_deploy_run.py runs without any pool).
"""

from __future__ import annotations

import shlex

import pytest
from click.testing import CliRunner

from farm.cli.main import main
from farm.device.fence import FENCE_NAME
from farm.pool import Holder, LeaseRequest, Pool
from farm.virtual import VirtualDeviceSpec
from tests.support.devices import make_qnn_bundle
from tests.support.pool import fake_device

CLEAN = {"PTEFARM_LEASE": None, "ANDROID_SERIAL": None, "PTEFARM_CONFIG": None, "COLUMNS": "250"}


@pytest.fixture
def lab(virtual_farm, pool_url, tmp_path):
    """(serial, config path, manifest, pool) with the one virtual device synced into the pool."""
    (record,) = virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    server = virtual_farm.adb_server
    config = tmp_path / "farm.toml"
    config.write_text(f'[farm]\nhome = "{tmp_path / "home"}"\n\n[pool]\nurl = "{pool_url}"\n\n'
                      f'[[adb_servers]]\nhost = "{server.host}"\nport = {server.port}\n')
    manifest = make_qnn_bundle(tmp_path / "bundle", name="enforced")
    with Pool.open(pool_url) as pool:
        pool.sync([fake_device(record.serial, server=str(server))])
        yield record.serial, config, manifest, pool


def farm(config, *args: str, **env: str):
    return CliRunner().invoke(main, [*args, "--config", str(config)], env={**CLEAN, **env})


def deploy(lab, *args: str, **env: str):
    serial, config, manifest, _ = lab
    return farm(config, "deploy", str(manifest), "--serial", serial, *args, **env)


def run(lab, *args: str, **env: str):
    serial, config, manifest, _ = lab
    return farm(config, "run", str(manifest), "--serial", serial, "--prompt", "hi", *args, **env)


def test_without_the_lease_a_pool_device_is_refused(lab):
    serial, _, _, pool = lab
    for result in (deploy(lab), run(lab)):
        assert result.exit_code == 2, result.output
        assert f"device {serial} is in the pool (available)" in result.stderr
        assert "--lease" in result.stderr and "PTEFARM_LEASE" in result.stderr
    lease = pool.acquire(LeaseRequest(serial=serial), Holder("alice", "ci-7", 42, purpose="nightly"),
                         ttl_s=60, timeout_s=5)
    refused = run(lab)
    assert refused.exit_code == 2 and "held by alice@ci-7 pid 42" in refused.stderr
    wrong = run(lab, "--lease", "0" * 32)
    assert wrong.exit_code == 2 and "unknown to this pool" in wrong.stderr
    assert "held by alice@ci-7 pid 42" in wrong.stderr and "[LeaseError]" in wrong.stderr
    pool.release(lease.token)


def test_with_the_lease_deploy_and_run_work_and_claim_the_fence(lab):
    serial, _, _, pool = lab
    lease = pool.acquire(LeaseRequest(serial=serial), ttl_s=60, timeout_s=5)
    deployed = deploy(lab, "--lease", lease.token)
    assert deployed.exit_code == 0, deployed.output
    assert "pushed" in deployed.stdout
    ran = run(lab, PTEFARM_LEASE=lease.token, ANDROID_SERIAL=serial)  # as under `farm pool exec`
    assert ran.exit_code == 0, ran.output
    device = pool_device(lab)
    assert device.shell(f"cat {shlex.quote(device.workspace + '/' + FENCE_NAME)}",
                        timeout=10).out.strip() == lease.token
    pool.release(lease.token)
    ended = run(lab, "--lease", lease.token)
    assert ended.exit_code == 2 and f"lease {lease.token[:8]} ended (released)" in ended.stderr
    assert f"device {serial} is available" in ended.stderr
    # The next lease claims the fence anew (the device now refuses the ended lease's commands).
    other = pool.acquire(LeaseRequest(serial=serial), ttl_s=60, timeout_s=5)
    assert run(lab, "--lease", other.token).exit_code == 0
    pool.release(other.token)


def test_force_warns_and_works(lab):
    serial, _, _, pool = lab
    lease = pool.acquire(LeaseRequest(serial=serial), Holder("bob", "h", 1), ttl_s=60, timeout_s=5)
    forced = run(lab, "--force")
    assert forced.exit_code == 0, forced.output
    assert "farm: warning:" in forced.stderr and "held by bob@h pid 1" in forced.stderr
    assert "without a lease (--force)" in forced.stderr
    pool.release(lease.token)


def test_a_quarantined_device_refuses_work(lab):
    serial, _, _, pool = lab
    pool.quarantine(serial, "battery swelling")
    for result in (deploy(lab), run(lab), run(lab, "--lease", "0" * 32)):
        assert result.exit_code == 3, result.output
        assert f"device {serial} is quarantined: battery swelling" in result.stderr
    forced = deploy(lab, "--force")
    assert forced.exit_code == 0, forced.output
    assert "quarantined (battery swelling); using it anyway (--force)" in forced.stderr


def test_a_device_the_pool_does_not_know_works_as_today(lab, pool_url, tmp_path):
    serial, config, manifest, _ = lab
    other_pool = f"sqlite:///{tmp_path / 'other-pool.db'}"
    with Pool.open(other_pool) as pool:  # a pool with devices, but not this one
        pool.sync([fake_device("elsewhere")])
    other = tmp_path / "other.toml"
    other.write_text(config.read_text().replace(f'url = "{pool_url}"', f'url = "{other_pool}"'))
    result = farm(other, "run", str(manifest), "--serial", serial, "--prompt", "hi")
    assert result.exit_code == 0, result.output
    assert "warning" not in result.stderr


def pool_device(lab):
    from farm.config import load_config
    from farm.device.discovery import find_device

    serial, config_path, _, _ = lab
    config = load_config(str(config_path))
    return find_device(config.adb_servers, serial, workspace_root=config.run.workspace)
