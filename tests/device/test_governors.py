"""CPU governors pinned where the device allows it (farm/device/conditions.py, pinned_governors): a root
shell gets ``performance`` on every policy that offers it for the block, each policy's own governor
back after (also when the block fails); a user build's shell changes nothing and says so; a write the
kernel refuses leaves no policy half-pinned."""

from __future__ import annotations

import pytest

from farm.device.conditions import pinned_governors
from farm.device.transport import ShellResult
from tests.support.fake_device import FakeDevice


def _device(tmp_path, *, uid: int, offers="schedutil performance powersave", cls=FakeDevice):
    policies = (("policy0", "schedutil"), ("policy4", "powersave"), ("policy7", "schedutil"))
    dev = cls(tmp_path / "dev", programs={"id": f"#!/bin/sh\necho {uid}\n"})
    cpufreq = dev.root / "sys" / "cpufreq"
    for name, governor in policies:
        (cpufreq / name).mkdir(parents=True)
        (cpufreq / name / "scaling_governor").write_text(governor + "\n")
        (cpufreq / name / "scaling_available_governors").write_text(offers + "\n")
    return dev, cpufreq


def _governors(cpufreq):
    return {p.name: (p / "scaling_governor").read_text().strip() for p in sorted(cpufreq.iterdir())}


def test_a_root_shell_pins_performance_and_restores_each_policy(tmp_path):
    dev, cpufreq = _device(tmp_path, uid=0)
    before = _governors(cpufreq)
    with pinned_governors(dev, cpufreq=str(cpufreq)) as status:
        assert status == "pinned performance (3 policies)"
        assert set(_governors(cpufreq).values()) == {"performance"}
    assert _governors(cpufreq) == before


def test_the_governors_come_back_when_the_block_fails(tmp_path):
    dev, cpufreq = _device(tmp_path, uid=0)
    before = _governors(cpufreq)
    with pytest.raises(RuntimeError), pinned_governors(dev, cpufreq=str(cpufreq)):
        raise RuntimeError("the run failed")
    assert _governors(cpufreq) == before


def test_a_user_build_shell_changes_nothing_and_says_so(tmp_path):
    dev, cpufreq = _device(tmp_path, uid=2000)
    before = _governors(cpufreq)
    with pinned_governors(dev, cpufreq=str(cpufreq)) as status:
        assert status == "not pinned: the shell is not root (uid 2000)"
        assert _governors(cpufreq) == before
    assert not any("echo performance" in c for c in dev.commands)  # not a single write tried


class _RefusingDevice(FakeDevice):
    """A kernel that refuses ``performance`` on policy7 (EINVAL, as a vendor kernel may): the writes
    before it in the same command happen, then the command fails."""

    def shell(self, command: str, *, timeout: float, check: bool = False) -> ShellResult:
        parts = command.split(" && ")
        refused = [i for i, part in enumerate(parts) if "performance" in part and "policy7" in part]
        if not refused:
            return super().shell(command, timeout=timeout, check=check)
        if refused[0]:
            super().shell(" && ".join(parts[:refused[0]]), timeout=timeout)
        return ShellResult(command, 1, b"", b"sh: write error: Invalid argument\n")


def test_a_refused_write_leaves_no_policy_half_pinned(tmp_path):
    dev, cpufreq = _device(tmp_path, uid=0, cls=_RefusingDevice)
    before = _governors(cpufreq)
    with pinned_governors(dev, cpufreq=str(cpufreq)) as status:
        assert status == "not pinned: scaling_governor refused the write"
        assert _governors(cpufreq) == before  # policy0 and policy4, written first, went back
    assert any("echo performance" in c for c in dev.commands)  # it was tried


def test_a_policy_without_performance_is_left_alone(tmp_path):
    dev, cpufreq = _device(tmp_path, uid=0, offers="schedutil powersave")
    with pinned_governors(dev, cpufreq=str(cpufreq)) as status:
        assert status == "not pinned: no cpufreq policy offers performance"
