"""A runner that cannot start is the bundle's fault: bad input (exit 2) naming the runner, the file
the device names and what it said, found by the --help the farm asks first, within seconds; never an
infrastructure error that retries, quarantines the device and waits for another.

The broken runners are shell scripts saying what a phone says: bionic's linker (``CANNOT LINK
EXECUTABLE "<exe>": <error>``, the culprit quoted first in the error), sh's 127 for a program not
found, a death by signal, a hang before the help."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from farm.bundle import manifest as bundle_mod
from farm.device.discovery import find_device
from farm.errors import InfraError, UsageError
from farm.execute import run as run_mod
from farm.execute.deploy import bundle_workspace, deploy
from farm.execute.run import (
    RunnerCannotStart,
    RunnerFailed,
    library_failure,
    run,
    runner_dialect,
    start_failure,
)
from farm.execute.runprofile import RunRequest
from farm.results.outcome import blames_device, classify
from farm.virtual import VirtualDeviceSpec, VirtualFarm
from farm.vocab import ErrorKind
from tests.support.devices import make_qnn_bundle

WS = "/data/local/tmp/ptefarm/x"
LINKER_NOT_FOUND = ('CANNOT LINK EXECUTABLE "./qnn_llama_runner": library '
                    '"libqnn_executorch_backend.so" not found: needed by main executable')
LINKER_BAD_ELF = (f'CANNOT LINK EXECUTABLE "./qnn_llama_runner": "{WS}/libqnn_executorch_backend.so" '
                  f'has bad ELF magic: 76657273')

BROKEN_RUNNERS = {
    # A wrapper around a program the device does not have: sh's 127.
    "exits-127": '#!/bin/sh\nexec farm-llama-runner-not-installed "$@"\n',
    # A phone without the backend library: the linker refuses the runner (older bionic exits 1).
    "backend-missing": f"#!/bin/sh\necho '{LINKER_NOT_FOUND}' >&2\nexit 1\n",
    # A backend library that is no ELF file (a Git LFS pointer): the linker aborts (SIGABRT).
    "backend-not-elf": f"#!/bin/sh\necho '{LINKER_BAD_ELF}' >&2\nkill -ABRT $$\n",
    "crashes": "#!/bin/sh\nkill -SEGV $$\n",
    "hangs": "#!/bin/sh\nsleep 600\n",
}


# -- the pure part: what --help's output and exit code say --------------------------------------------

@pytest.mark.parametrize("text,code,reason,culprit", [
    (LINKER_NOT_FOUND + "\n", 1, "the dynamic linker refuses it", "libqnn_executorch_backend.so"),
    (LINKER_BAD_ELF + "\n", 134, "the dynamic linker refuses it", f"{WS}/libqnn_executorch_backend.so"),
    ("sh: 1: exec: farm-llama-runner-x: not found\n", 127, "the shell cannot run it (exit 127)", None),
    ("/system/bin/sh: ./qnn_llama_runner: can't execute: Exec format error\n", 126,
     "the shell cannot run it (exit 126)", None),
    ("", 139, "it was killed by SIGSEGV at start (exit 139)", None),
    ("", 129, "it was killed by SIGHUP at start (exit 129)", None),  # the first signal's death
    # a refusal that quotes no file: the linker's own trouble, nobody's file to name
    ('CANNOT LINK EXECUTABLE "./qnn_llama_runner": out of memory\n', 1,
     "the dynamic linker refuses it", None),
    ('E QnnDsp: dlopen failed: library "libQnnHtp.so" not found\n', 1,
     "a library it loads is refused", "libQnnHtp.so"),
])
def test_a_runner_that_cannot_start_is_told_by_its_help(text, code, reason, culprit):
    assert start_failure(text, code) == (reason, culprit)


@pytest.mark.parametrize("text,library", [
    # glibc, under the host runner (its executorch links libqnn_executorch_backend.so)
    ("ImportError: ./libqnn_executorch_backend.so: file too short\n", "./libqnn_executorch_backend.so"),
    ("OSError: /ws/libQnnHtp.so: invalid ELF header\n", "/ws/libQnnHtp.so"),
    ("libfoo.so.1: cannot open shared object file: No such file or directory\n", "libfoo.so.1"),
    # bionic, QNN opening its libraries while the model loads
    ('E QnnDsp: dlopen failed: library "libQnnHtpV75Stub.so" not found\n', "libQnnHtpV75Stub.so"),
    ("fake runner: cannot load model\n", None),
])
def test_a_library_that_cannot_be_loaded_is_named(text, library):
    assert library_failure(text) == library


@pytest.mark.parametrize("text,code", [
    ("    -model_path (x) type: string default: \"a.pte\"\n", 1),  # gflags help: exits 1
    ("usage: stand-in\n", 0),  # a stand-in script that knows no flags
    ("/system/bin/sh: cd: /data/local/tmp/ptefarm/x: No such file or directory\n", 2),  # not deployed
    ("runner: finished with status 255\n", 255),  # a runner's own exit code, no signal's (128+127)
    # it complained of a library and went on to exit 0: it started (the library was optional)
    ('E QnnDsp: dlopen failed: library "libQnnHtpV79Stub.so" not found\n', 0),
    ("", None),  # no exit code known (the shell did not say): nothing to judge by
    ("", 128),  # 128 + 0: no signal
])
def test_a_runner_that_started_is_not_called_broken(text, code):
    assert start_failure(text, code) is None


# -- on a virtual device ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def device(tmp_path_factory):
    root = tmp_path_factory.mktemp("cannot-start")
    with VirtualFarm(home=root / "farm") as vf:
        (record,) = vf.up([VirtualDeviceSpec(soc="SM8650")])
        yield find_device([vf.adb_server], record.serial), root


def broken_bundle(root: Path, kind: str, dialect: str = "auto") -> Path:
    """A fake QNN bundle whose runner is the broken script ``kind``."""
    manifest = make_qnn_bundle(root / kind / dialect, name=f"broken-{kind}-{dialect}", dialect=dialect)
    bundle = bundle_mod.load(manifest)
    runner = manifest.parent / "qnn_llama_runner"
    runner.write_text(BROKEN_RUNNERS[kind])
    files = [bundle_mod.describe_file(manifest.parent, runner, role="runner") if f.role == "runner"
             else f for f in bundle.files]
    dataclasses.replace(bundle, files=files).write(manifest)
    return manifest


@pytest.mark.parametrize("dialect", ["auto", "qnn-v1.0"])
@pytest.mark.parametrize("kind,culprit,said", [
    ("exits-127", "./qnn_llama_runner", "farm-llama-runner-not-installed"),
    ("backend-missing", "libqnn_executorch_backend.so", "CANNOT LINK EXECUTABLE"),
    ("backend-not-elf", "libqnn_executorch_backend.so", "has bad ELF magic"),
    ("crashes", "./qnn_llama_runner", "SIGSEGV"),
    ("hangs", "./qnn_llama_runner", "did not finish"),
])
def test_a_broken_runner_is_bad_input_naming_runner_file_and_message(device, kind, culprit, said,
                                                                     dialect):
    dev, root = device
    manifest = broken_bundle(root, kind, dialect)
    bundle = bundle_mod.load(manifest)
    deploy(dev, bundle)
    started = time.monotonic()
    with pytest.raises(UsageError) as caught:  # the --help of a hang is given 10 s, not 60
        run(dev, bundle, RunRequest(prompts=["hi"]), timeout=60, io_timeout=10)
    elapsed = time.monotonic() - started
    error = caught.value
    assert isinstance(error, RunnerCannotStart) and not isinstance(error, InfraError)
    # What the plugin makes of it: a bad-input error, not held against the device, not re-run.
    assert classify(error) is ErrorKind.USAGE and not blames_device(error)
    message = str(error)
    assert message.startswith(f"{manifest}: runner ./qnn_llama_runner on {dev.serial} cannot start")
    assert culprit in message and said in message and error.culprit == culprit
    if kind.startswith("backend"):  # the file the linker names is the bundle's, with its host path
        assert str(manifest.parent / "libqnn_executorch_backend.so") in message
    # Bounded by the help's own timeout: one question, never retried.
    assert elapsed < 60
    ws = Path(bundle_workspace(dev, bundle))
    assert not (ws / "runs").exists() or not list((ws / "runs").iterdir())  # no run was started
    # The next test of the same bundle on this device is told at once, without asking again.
    with pytest.raises(RunnerCannotStart, match="cannot start"):
        runner_dialect(_NoShell(dev), bundle)


class _NoShell:
    """A device on which any shell command fails the test: nothing may be asked of it."""

    def __init__(self, device):
        self._device = device

    def __getattr__(self, name):
        return getattr(self._device, name)

    def shell(self, command: str, **kw):
        raise AssertionError(f"asked the device again: {command}")


def test_a_hung_help_is_killed_on_the_device(device):
    dev, root = device
    bundle = bundle_mod.load(broken_bundle(root, "hangs", "auto"))
    deploy(dev, bundle)
    run_mod._CANNOT_START.clear()
    with pytest.raises(RunnerCannotStart):
        runner_dialect(dev, bundle, timeout=10)
    ws = bundle_workspace(dev, bundle)
    # Every process still working in the workspace: the hung runner and its children, if any.
    left = dev.shell(f"for p in /proc/[0-9]*; do [ \"$(readlink $p/cwd 2>/dev/null)\" = {ws} ] && "
                     f"tr '\\0' ' ' < $p/cmdline; done; true", timeout=30).out
    assert not left.strip(), f"still running in {ws}: {left}"


def test_a_device_that_stops_answering_during_help_stays_an_infra_error(device, monkeypatch):
    """The hang is the runner's only while the device answers: a device that answers nothing at
    all is the device's (the timeout stands, and counts toward its quarantine)."""
    from farm.errors import DeviceTimeout

    dev, root = device
    bundle = bundle_mod.load(broken_bundle(root, "hangs", "qnn-v1.0"))
    deploy(dev, bundle)
    run_mod._CANNOT_START.clear()

    class Dead:
        serial = dev.serial

        def __getattr__(self, name):
            return getattr(dev, name)

        def shell(self, command, **kw):
            raise DeviceTimeout(f"device {dev.serial}: no answer to {command[:40]}", serial=dev.serial)

    with pytest.raises(DeviceTimeout) as caught:
        runner_dialect(Dead(), bundle, timeout=10)
    assert blames_device(caught.value)


# -- through the plugin: a qualification of a bundle whose runner hangs -------------------------------

def test_qualifying_a_bundle_whose_runner_hangs_is_bad_input_and_the_device_stays_available(tmp_path):
    """The smoke suite against a bundle whose runner hangs at start, on one virtual SM8650: every
    test that needs the runner is a bad-input error naming it (the first after one help timeout, the
    farm's [run] help_timeout_s, the rest at once), the run's verdict is bad input, nothing is re-run and the device is neither
    quarantined nor charged an infrastructure failure."""
    from farm.cli.qualify import exit_code as qualify_exit_code
    from farm.exitcodes import ExitCode
    from farm.pool import Pool
    from tests.support.plugin import SUITES, explain, farm_toml, junit_cases, results_json, run_pytest

    manifest = broken_bundle(tmp_path / "bundle", "hangs", "qnn-v1.0")
    pool_url = f"sqlite:///{tmp_path / 'pool.db'}"
    with VirtualFarm(home=tmp_path / "farm") as vf:
        (record,) = vf.up([VirtualDeviceSpec(soc="SM8650")])
        # A help timeout of 5 s, not the default 60: the path is the same, the wait shorter.
        config = farm_toml(tmp_path / "farm.toml", vf.adb_server.port, pool_url,
                           run={"help_timeout_s": 5})
        out = tmp_path / "out"
        started = time.monotonic()
        proc = run_pytest([str(SUITES / "test_smoke.py"), "--farm-config", str(config),
                           "--farm-bundle", str(manifest), "--farm-retry-delay", "0.2",
                           "--farm-out", str(out)], cwd=tmp_path)
        elapsed = time.monotonic() - started
        # pytest's own code says "errors"; the farm's (farm qualify) says bad input, from the verdict.
        assert proc.returncode == pytest.ExitCode.TESTS_FAILED, explain(proc)
        assert qualify_exit_code(proc.returncode, out / "results.json") == ExitCode.BAD_INPUT
        cases = {c.name.split("[")[0]: c for c in junit_cases(out)}
        assert cases["test_device_answers"].outcome == "passed"
        for name in ("test_workspace_has_room", "test_runner_loads_every_mode"):
            case = cases[name]
            assert case.outcome == "error", (name, case.outcome, case.message)
            assert "runner ./qnn_llama_runner" in case.message and "cannot start" in case.message
            assert case.properties.get("attempts", "1") == "1"  # never re-run
        meta = results_json(out)["meta"]
        assert meta["verdict"] == "bad-input", meta["verdict"]
        with Pool.open(pool_url) as pool:
            (device,) = [d.device for d in pool.status().devices]
            assert device.serial == record.serial
            assert device.state == "available" and device.infra_failures == 0
            assert "infra_failure" not in [e.kind for e in pool.history(serial=record.serial)]
    assert elapsed < 600  # one help timeout, not three probes, a quarantine and a lease wait


# -- at run time: a library the runner loads while it runs ---------------------------------------------

LOADS_A_BROKEN_LIBRARY = """#!/bin/sh
if [ "$1" = --help ]; then printf '    -kv_updater (How to update kv cache) type: string default: ""\\n'; exit 1; fi
echo 'ImportError: ./libqnn_executorch_backend.so: file too short' >&2
exit 1
"""
FAILS_ON_ITS_OWN = LOADS_A_BROKEN_LIBRARY.replace(
    "ImportError: ./libqnn_executorch_backend.so: file too short", "runner: cannot load model")


@pytest.mark.parametrize("script,error", [(LOADS_A_BROKEN_LIBRARY, RunnerCannotStart),
                                          (FAILS_ON_ITS_OWN, RunnerFailed)])
def test_a_run_refused_a_library_is_bad_input_other_exits_are_failures(tmp_path, script, error):
    """A runner that starts (its --help is fine) but whose run stops at a library the loader refuses
    (the host runner's executorch importing the workspace's libqnn_executorch_backend.so, QNN's
    dlopen of libQnnHtp.so) is the bundle's fault; any other non-zero exit stays the runner's."""
    from tests.support.fake_device import FakeDevice

    bundle = bundle_mod.load(make_qnn_bundle(tmp_path / "bundle", name="loads", dialect="qnn-v1.0"))
    device = FakeDevice(tmp_path / "device", serial="fake-loader")
    deploy(device, bundle)
    (Path(bundle_workspace(device, bundle)) / bundle.runner).write_text(script)
    with pytest.raises(error) as caught:
        run(device, bundle, RunRequest(prompts=["hi"]), timeout=60)
    if error is RunnerCannotStart:
        assert caught.value.culprit == "libqnn_executorch_backend.so"
        assert "a library it loads is refused" in str(caught.value)
        assert str(tmp_path / "bundle" / "libqnn_executorch_backend.so") in str(caught.value)
