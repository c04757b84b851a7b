"""A bundle of 10,000 files deploys to a device that refuses over-long commands as a phone does
(issue 24, item 7). Slow (10,000 renames on the device, minutes on a loaded host), so it stays out of the
mutation run's selection; test_deploy_many_files.py checks the same cuts with a small bound, fast."""

from __future__ import annotations

import dataclasses

import pytest

from farm.execute import devicecmd
from farm.execute.deploy import deploy
from tests.execute.test_deploy_many_files import ArgLimitDevice, _holds_exactly
from tests.support.random_bundle import make_bundle


@pytest.mark.slow
def test_a_bundle_of_ten_thousand_files_deploys(tmp_path):
    """10,000 names of 20-odd bytes: one command would be ten times what a phone takes."""
    base = make_bundle(tmp_path / "b", "many", {"model.pte": 3000, "lib/part.so": 10})
    part = base.files[1]  # one host file under 10,000 names: the host side costs nothing
    bundle = dataclasses.replace(base, files=[base.files[0], *(
        dataclasses.replace(part, name=f"lib/part-{i:05d}.so") for i in range(10_000))])
    device = ArgLimitDevice(tmp_path / "device")
    report = deploy(device, bundle)
    assert device.refused == [] and report.files_pushed == len(bundle.files)
    _holds_exactly(device, bundle)
    assert max(len(c.encode()) for c in device.commands) <= devicecmd.COMMAND_BYTES

    device.pushes.clear()
    again = deploy(device, bundle)
    assert (again.files_pushed, again.files_skipped) == (0, len(bundle.files))
    assert device.refused == [] and device.pushes == []
