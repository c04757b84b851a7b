"""The fence as the device runs it: ``FencedDevice``'s commands executed by a real POSIX shell (``sh -c``
in a temporary directory standing in for the device's workspace, as tests/support/fake_device.py does),
so what is judged is what a phone's shell would do with them: the claim writes the token, a command of
the lease holding the fence runs, anyone else's is refused before it does anything, and only that
refusal (exit 75 with the marker on stderr) is taken for one.

tests/device/test_fence.py shows the same against virtual devices and a pool; these need neither.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from farm.device.fence import FENCE_NAME, FENCED_EXIT, FENCED_MARK, FencedDevice
from farm.errors import AdbError, LeaseLost
from tests.support.fake_device import FakeDevice

TOKEN = "0123456789abcdef-ours"
OTHER = "fedcba9876543210-theirs"


class _Lease:
    """The part of a pool lease the fence uses: its token, and ``check`` (raises once it is lost)."""

    def __init__(self, token: str = TOKEN):
        self.token = token
        self.checks = 0
        self.lost = False

    def check(self) -> None:
        self.checks += 1
        if self.lost:
            raise LeaseLost("lease not renewed for over its TTL", serial="fake-1")


class _Recording(FakeDevice):
    """A FakeDevice that also records how each command and read was asked for (timeout, check)."""

    def __init__(self, root: Path):
        super().__init__(root)
        self.calls: list[tuple[str, float, bool]] = []
        self.read_timeouts: list[float] = []

    def shell(self, command: str, *, timeout: float, check: bool = False):
        self.calls.append((command, timeout, check))
        return super().shell(command, timeout=timeout, check=check)

    def read_file(self, remote: str, *, timeout: float = 60.0) -> bytes:
        self.read_timeouts.append(timeout)
        return super().read_file(remote, timeout=timeout)


@pytest.fixture
def device(tmp_path) -> _Recording:
    return _Recording(tmp_path / "device")


def _fence(device: FakeDevice) -> Path:
    return Path(device.workspace) / FENCE_NAME


def _claimed(device: FakeDevice, token: str = TOKEN) -> FencedDevice:
    fenced = FencedDevice(device, _Lease(token))
    fenced.claim()
    return fenced


# -- claiming the fence -------------------------------------------------------------------------------

def test_a_claim_writes_exactly_our_token_to_the_workspaces_fence(device):
    fenced = FencedDevice(device, _Lease())
    assert fenced.fence_path == f"{device.workspace}/{FENCE_NAME}"
    assert not fenced.holds()
    fenced.claim()
    assert _fence(device).read_text() == TOKEN  # no newline: the guard compares the whole file
    assert sorted(p.name for p in Path(device.workspace).glob(f"{FENCE_NAME}*")) == [FENCE_NAME]
    assert fenced.holds()
    assert fenced.lease.checks == 1


class _NewPhone(FakeDevice):
    """A device whose workspace is not made yet (its first use by the farm)."""

    @property
    def workspace(self) -> str:
        return str(self.root / "new" / "workspace")


def test_a_claim_creates_a_missing_workspace(tmp_path):
    device = _NewPhone(tmp_path / "device")
    fenced = _claimed(device)
    assert _fence(device).read_text() == TOKEN and fenced.holds()


def test_a_claim_replaces_an_older_leases_fence(device):
    old = _claimed(device, OTHER)
    new = _claimed(device)
    assert _fence(device).read_text() == TOKEN
    assert new.holds() and not old.holds()


def test_the_callers_timeouts_reach_the_device_and_a_claim_is_checked(device):
    device.calls.clear()
    fenced = FencedDevice(device, _Lease())
    fenced.claim(timeout=7.0)
    assert [(timeout, check) for _, timeout, check in device.calls] == [(7.0, True)]
    fenced.holds(timeout=8.0)
    assert device.calls[-1][1] == 8.0


def test_a_claim_that_cannot_write_is_an_infrastructure_error(device):
    (Path(device.workspace) / f"{FENCE_NAME}.tmp").mkdir()  # printf cannot write its temporary file
    with pytest.raises(AdbError, match="fake-1.*exited"):
        FencedDevice(device, _Lease()).claim()
    assert not _fence(device).exists()


def test_a_lost_lease_claims_nothing(device):
    lease = _Lease()
    lease.lost = True
    with pytest.raises(LeaseLost):
        FencedDevice(device, lease).claim()
    assert device.calls == [] and not _fence(device).exists()


def test_holds_ignores_a_trailing_newline_but_not_a_different_token(device):
    fenced = FencedDevice(device, _Lease())
    _fence(device).write_text(TOKEN + "\n")
    assert fenced.holds()
    _fence(device).write_text(TOKEN + "x")
    assert not fenced.holds()
    _fence(device).write_text(TOKEN[:8])
    assert not fenced.holds()


# -- commands of the holder and of anyone else --------------------------------------------------------

def test_the_holders_commands_run_as_asked(device):
    fenced = _claimed(device)
    result = fenced.shell("echo out; echo err >&2; touch made; exit 3", timeout=9.0)
    assert (result.exit_code, result.out, result.err) == (3, "out\n", "err\n")
    assert (Path(device.workspace) / "made").exists()
    assert device.calls[-1][1:] == (9.0, False)  # the guard's result is judged here, not by the device
    assert fenced.lease.checks == 2  # the claim, then the command: the lease's clock is asked each time


@pytest.mark.parametrize("fence", [OTHER, None, TOKEN[:8], TOKEN + "-more"],
                         ids=["another lease", "no fence", "a prefix of ours", "ours and more"])
@pytest.mark.parametrize("check", [False, True])
def test_a_command_of_a_lease_that_does_not_hold_the_fence_is_refused_unrun(device, fence, check):
    fenced = FencedDevice(device, _Lease())
    if fence is not None:
        _fence(device).write_text(fence)
    with pytest.raises(LeaseLost) as caught:
        fenced.shell("touch made", timeout=5.0, check=check)
    assert str(caught.value) == (f"device fake-1 is held by another lease now: "
                                 f"{FENCED_MARK} lease {TOKEN[:8]} no longer holds this device")
    assert caught.value.serial == "fake-1"
    assert not (Path(device.workspace) / "made").exists()


def test_a_token_is_quoted_for_the_devices_shell(device):
    """A token with shell syntax in it is compared as a string, never run."""
    token = "tok'en $(touch injected) ; touch injected2"
    fenced = _claimed(device, token)
    assert _fence(device).read_text() == token and fenced.holds()
    assert fenced.shell("echo ran", timeout=5.0).out == "ran\n"
    with pytest.raises(LeaseLost):
        FencedDevice(device, _Lease("tok'en")).shell("touch made", timeout=5.0)
    assert sorted(p.name for p in Path(device.workspace).iterdir() if not p.name.startswith(".")) == []


@pytest.mark.parametrize("command", [
    f"echo '{FENCED_MARK} mine' >&2; exit 74",  # the marker, but not the fence's exit code
    f"echo '{FENCED_MARK} mine'; exit {FENCED_EXIT}",  # the exit code, the marker on stdout
    f"echo other >&2; exit {FENCED_EXIT}",  # the exit code without the marker
], ids=["marker only", "marker on stdout", "exit code only"])
def test_only_the_fences_own_refusal_is_taken_for_one(device, command):
    result = _claimed(device).shell(command, timeout=5.0)
    assert result.exit_code in (74, FENCED_EXIT)


def test_a_lost_lease_sends_nothing(device):
    fenced = _claimed(device)
    fenced.lease.lost = True
    sent = len(device.calls)
    with pytest.raises(LeaseLost, match="not renewed"):
        fenced.shell("touch made", timeout=5.0)
    with pytest.raises(LeaseLost):
        fenced.push(io.BytesIO(b"x"), f"{device.workspace}/pushed")
    with pytest.raises(LeaseLost):
        fenced.read_file(_fence(device).as_posix())
    assert len(device.calls) == sent and device.pushes == [] and device.reads == []


# -- a failed command, when the caller asked for a check ----------------------------------------------

@pytest.mark.parametrize("command, message", [
    ("echo why >&2; exit 4", "device fake-1: 'echo why >&2; exit 4' exited 4: why"),
    ("echo only-stdout; exit 5", "device fake-1: 'echo only-stdout; exit 5' exited 5: only-stdout"),
    ("true " + "x" * 130 + "; exit 6", f"device fake-1: {('true ' + 'x' * 130)[:120]!r} exited 6: "),
    ("printf %0300d 0 >&2; exit 7", f"device fake-1: 'printf %0300d 0 >&2; exit 7' exited 7: {'0' * 200}"),
], ids=["stderr", "stdout when stderr is empty", "long command", "long output"])
def test_a_checked_command_that_fails_names_the_device_command_exit_and_output(device, command, message):
    fenced = _claimed(device)
    with pytest.raises(AdbError) as caught:
        fenced.shell(command, timeout=5.0, check=True)
    assert str(caught.value) == message
    assert caught.value.serial == "fake-1" and not isinstance(caught.value, LeaseLost)
    assert fenced.shell(command, timeout=5.0).exit_code != 0  # unchecked: the result, not an error


# -- files and everything else ------------------------------------------------------------------------

def test_pushes_and_reads_go_to_the_device_while_the_lease_holds(device):
    fenced = _claimed(device)
    remote = f"{device.workspace}/pushed"
    assert fenced.push(io.BytesIO(b"payload"), remote, mode=0o600) == 7
    assert (Path(remote).read_bytes(), Path(remote).stat().st_mode & 0o777) == (b"payload", 0o600)
    assert fenced.read_file(remote, timeout=3.0) == b"payload"
    assert device.read_timeouts == [3.0]  # the caller's timeout, not the device's default
    assert fenced.lease.checks == 3  # claim, push, read
    assert (fenced.serial, fenced.soc, fenced.workspace) == ("fake-1", "SM8650", device.workspace)
