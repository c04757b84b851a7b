"""`farm pool lease` / `exec` first refresh the configured adb servers' device lists, so a device that is
there but was not seen within the liveness bound (nobody ran `farm pool watch`) is leased at once."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from farm.pool import Pool
from farm.virtual import VirtualDeviceSpec
from tests.support.plugin import explain, farm_toml


def test_a_stale_but_present_device_is_leased_after_a_refresh(virtual_farm, tmp_path):
    [dev] = virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    url = f"sqlite:///{tmp_path / 'pool.db'}"
    config = farm_toml(tmp_path / "farm.toml", virtual_farm.adb_server.port, url, liveness_s=1)
    env = {**os.environ, "PTEFARM_CONFIG": str(config)}

    def farm(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-P", "-m", "farm.cli.main", *args], env=env, text=True,
                              capture_output=True, timeout=60)

    assert farm("pool", "sync").returncode == 0
    time.sleep(2.5)  # past the liveness bound: without a refresh the device is not leased
    proc = farm("pool", "lease", "--soc", "SM8650", "--timeout", "5")
    assert proc.returncode == 0, explain(proc)
    assert dev.serial in proc.stderr
    with Pool.open(url) as pool:
        kinds = [e.kind for e in pool.history(serial=dev.serial)]
    assert kinds[-1] == "leased"
