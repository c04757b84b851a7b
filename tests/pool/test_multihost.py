"""Many hosts on one machine: two adb servers with their own virtual devices, one PostgreSQL pool,
``farm pool sync`` discovering both, and two independent processes leasing and using the devices."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from farm.pool import AVAILABLE, Pool
from farm.virtual import VirtualDeviceSpec, VirtualFarm
from tests.support.pool import check_event_log, collect, reaped, start_worker

pytestmark = pytest.mark.postgres


def test_two_adb_servers_one_postgres_pool(pg_pool_url, tmp_path):
    with VirtualFarm(home=tmp_path / "host-a") as host_a, VirtualFarm(home=tmp_path / "host-b") as host_b:
        devs_a = host_a.up([VirtualDeviceSpec(soc="SM8650"), VirtualDeviceSpec(soc="SM8550")])
        devs_b = host_b.up([VirtualDeviceSpec(soc="SM8650")])
        servers = {d.serial: str(host_a.adb_server) for d in devs_a}
        servers |= {d.serial: str(host_b.adb_server) for d in devs_b}
        assert host_a.adb_server != host_b.adb_server
        config = tmp_path / "farm.toml"
        config.write_text(
            f'[farm]\nhome = "{tmp_path / "home"}"\n'
            f'[pool]\nurl = "{pg_pool_url}"\n'
            + "".join(f'[[adb_servers]]\nhost = "{s.host}"\nport = {s.port}\n'
                      for s in (host_a.adb_server, host_b.adb_server)))
        env = {**os.environ, "PTEFARM_CONFIG": str(config)}
        sync = subprocess.run([sys.executable, "-P", "-m", "farm.cli.main", "pool", "sync"], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=120, check=False)
        assert sync.returncode == 0, sync.stderr
        with Pool.open(pg_pool_url) as pool:
            status = pool.status()
        found = {d.device.serial: (d.device.server, d.device.soc) for d in status.devices}
        assert found == {d.serial: (servers[d.serial], d.soc) for d in devs_a + devs_b}

        specs = {"hi": {"request": {"socs": ["SM8650"], "priority": "release"}, "cycles": 6,
                        "hold_s": 0.05},
                 "lo": {"request": {"priority": "pr"}, "cycles": 6, "hold_s": 0.05}}
        procs = {}
        with reaped(procs):
            for name, spec in specs.items():
                procs[name] = start_worker("use", pg_pool_url, name, json.dumps(spec))
            results = collect(procs)
        uses = []
        for name, (out, err) in results.items():
            assert procs[name].returncode == 0, f"{name}: {err[-3000:]}"
            lines = [json.loads(line) for line in out.splitlines()]
            assert len(lines) == specs[name]["cycles"]
            uses += lines
        for use in uses:  # each lease led to the right device through its own adb server
            assert use["server"] == servers[use["serial"]]
            assert use["soc"] == found[use["serial"]][1]
        assert all(u["soc"] == "SM8650" for u in uses if u["worker"] == "hi")
        assert {u["server"] for u in uses} == {str(host_a.adb_server), str(host_b.adb_server)}

        with Pool.open(pg_pool_url) as pool:
            devices = {d.device.serial: d.device for d in pool.status().devices}
            counts = check_event_log(pool.history(limit=None), devices)
            assert counts["leased"] == counts["ended"] == 12
            assert all(d.state == AVAILABLE for d in devices.values())

            # Host B goes away: its device goes offline on the next sync, host A's stay.
            host_b.down()
            sync = subprocess.run([sys.executable, "-P", "-m", "farm.cli.main", "pool", "sync"],
                                  cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
            assert sync.returncode == 3 and str(host_b.adb_server) in sync.stderr
            states = {d.device.serial: d.device.state for d in pool.status().devices}
            assert states == {**{d.serial: AVAILABLE for d in devs_a},
                              **{d.serial: "offline" for d in devs_b}}
