"""Which flags a run gives the bundle's runner: what its ``--help`` shows on the device, asked once per
device and runner build (FakeDevice: no adb).

An ``auto`` bundle runs in the dialect its runner's help shows; a declared dialect the help contradicts
is refused naming the device, also when the answer came from the cache; a help that shows no dialect is
not remembered (asked again next time) and leaves an ``auto`` bundle unable to run, saying what the
help printed and how it exited.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import shlex
from pathlib import Path

import pytest

from farm.bundle.manifest import describe_file
from farm.errors import AdbError, DeviceTimeout, UsageError
from farm.execute import run as run_mod
from farm.execute.deploy import bundle_workspace, deploy
from farm.execute.run import RunnerCannotStart, run
from tests.execute.run_support import RecordingDevice, runner_script, scripted, scripted_bundle
from tests.support.runner_help_texts import HOST_RUNNER, QNN_V1_0_1, QNN_V1_1_0

NO_DIALECT = "usage: qnn_llama_runner [options]\nqnn_llama_runner: cannot open libQnnHtp.so\n"
# A v1.0-dialect runner's help without --dump_logits_path (an older build, or a wrapper hiding it).
NO_FLAG_HELP = ("qnn_llama_runner: Warning: SetUsageMessage() never called\n\n"
                "  Flags from examples/qualcomm/oss_scripts/llama/qnn_llama_runner.cpp:\n"
                "    -kv_updater (How to update kv cache. Choose between SmartMask and ShiftPointer)\n"
                "      type: string default: \"SmartMask\"\n"
                "    -model_path (Model serialized in flatbuffer format.) type: string\n"
                "      default: \"kv_llama_qnn.pte\"\n")


@pytest.fixture(autouse=True)
def fresh_help_cache(monkeypatch):
    monkeypatch.setattr(run_mod, "_HELP", {})


def device(tmp_path, serial: str, **kw) -> RecordingDevice:
    return RecordingDevice(tmp_path / serial, serial=serial, **kw)


def deployed(tmp_path, dev: RecordingDevice, name: str, help_text: str, dialect: str = "auto"):
    bundle = scripted_bundle(tmp_path / "bundles" / name, name, help_text, dialect=dialect)
    deploy(dev, bundle)
    return bundle


def flags(dev, bundle) -> tuple[str, ...]:
    """The dialect-telling flags the runner was given."""
    result = run(dev, bundle, scripted(text="ok", ids={"generated_ids": [1]}), timeout=60)
    argv = json.loads(result.stdout.splitlines()[-1])["argv"]
    return tuple(f for f in ("--kv_updater", "--shared_buffer", "--token_ids_path") if f in argv)


def test_an_auto_bundles_runner_is_asked_once_per_device_and_runner_build(tmp_path):
    a, b = device(tmp_path, "dev-a"), device(tmp_path, "dev-b")
    v1_0 = deployed(tmp_path, a, "v1-0", QNN_V1_0_1)
    assert flags(a, v1_0) == flags(a, v1_0) == ("--kv_updater",)
    assert len(a.help_calls()) == 1  # the second run took the answer from the cache
    deploy(b, v1_0)
    assert flags(b, v1_0) == ("--kv_updater",) and len(b.help_calls()) == 1  # another device: asked
    v1_1 = deployed(tmp_path, a, "v1-1", QNN_V1_1_0)  # another runner build on the same device: asked
    assert flags(a, v1_1) == flags(a, v1_1) == ("--shared_buffer",)
    assert len(a.help_calls()) == 2
    assert flags(a, v1_0) == ("--kv_updater",) and len(a.help_calls()) == 2


def test_the_build_asked_about_is_the_named_runners_not_another_runner_files(tmp_path):
    """A bundle may ship other files of role runner (a wrapper, an older build): the cache answers for
    the runner the manifest names, so a new build of it beside the same other file is asked anew."""
    dev = device(tmp_path, "dev-a")
    bundles = []
    for name, help_text in (("v1-0", QNN_V1_0_1), ("v1-1", QNN_V1_1_0)):
        bundle = scripted_bundle(tmp_path / "bundles" / name, name, help_text)
        aux = tmp_path / "bundles" / name / "aux_runner"
        aux.write_text("#!/bin/sh\necho the same helper in both bundles\n")
        other = describe_file(aux.parent, aux, role="runner")
        bundle = dataclasses.replace(bundle, files=[other, *bundle.files])
        deploy(dev, bundle)
        bundles.append(bundle)
    assert [flags(dev, b) for b in bundles] == [("--kv_updater",), ("--shared_buffer",)]
    assert len(dev.help_calls()) == 2


def test_the_host_runner_on_the_devices_path_is_asked_like_any_other(tmp_path):
    dev = device(tmp_path, "dev-a", programs={"farm-llama-runner": runner_script(HOST_RUNNER)})
    bundle = scripted_bundle(tmp_path / "host", "host", HOST_RUNNER)
    bundle = dataclasses.replace(bundle, runner=None, files=[f for f in bundle.files if f.role != "runner"])
    deploy(dev, bundle)
    assert flags(dev, bundle) == flags(dev, bundle) == ("--kv_updater", "--token_ids_path")
    (asked,) = dev.help_calls()
    assert asked.endswith(" farm-llama-runner --help 2>&1") and "./" not in asked


@pytest.mark.parametrize("cached", [False, True], ids=["asked", "cached"])
def test_a_declared_dialect_the_runner_contradicts_is_refused_naming_the_device(tmp_path, cached):
    dev = device(tmp_path, "dev-a")
    if cached:  # the same runner build, in another bundle that lets it tell its dialect
        assert flags(dev, deployed(tmp_path, dev, "auto", QNN_V1_1_0)) == ("--shared_buffer",)
    declared = deployed(tmp_path, dev, "declared", QNN_V1_1_0, dialect="qnn-v1.0")
    with pytest.raises(UsageError) as caught:
        flags(dev, declared)
    assert str(caught.value) == (
        f"{declared.manifest_path}: runner ./qnn_llama_runner on dev-a: the manifest's 'runner_dialect' "
        f"is 'qnn-v1.0' but the runner is 'qnn-v1.4' (its --help lists --shared_buffer); fix "
        f"the manifest or set 'runner_dialect' to 'auto'")
    assert len(dev.help_calls()) == 1
    assert dev.runner_calls() == ([dev.runner_calls()[0]] if cached else [])  # the refused one never ran


def test_a_help_showing_no_dialect_is_asked_again_and_an_auto_bundle_cannot_run(tmp_path):
    dev = device(tmp_path, "dev-a")
    declared = deployed(tmp_path, dev, "declared", NO_DIALECT, dialect="qnn-v1.0")
    assert flags(dev, declared) == flags(dev, declared) == ("--kv_updater",)  # nothing contradicts it
    assert len(dev.help_calls()) == 2  # not remembered: the next deploy may bring the runner's libraries
    auto = deployed(tmp_path, dev, "auto", NO_DIALECT)
    with pytest.raises(UsageError) as caught:
        flags(dev, auto)
    message = str(caught.value)
    assert message.startswith(f"{auto.manifest_path}: runner ./qnn_llama_runner on dev-a: cannot tell "
                              f"its dialect ('runner_dialect' is 'auto'): its --help lists none of ")
    assert message.endswith("; --help exited 1: qnn_llama_runner: cannot open libQnnHtp.so; deploy the "
                            "bundle first, or declare the manifest's 'runner_dialect'")


@pytest.mark.parametrize("help_text, takes", [(QNN_V1_0_1, True), (HOST_RUNNER, True),
                                              (NO_FLAG_HELP, False)],
                         ids=["v1.0.1", "a wrapped host runner", "a help without it"])
def test_whether_a_runner_takes_a_flag_is_what_its_help_on_that_device_lists(tmp_path, help_text,
                                                                             takes):
    dev = device(tmp_path, "dev-a")
    bundle = deployed(tmp_path, dev, "b", help_text)
    assert run_mod.takes_flag(dev, bundle, "dump_logits_path") is takes
    assert run_mod.takes_flag(dev, bundle, "kv_updater")
    assert not run_mod.takes_flag(dev, bundle, "no_such_flag")
    assert len(dev.help_calls()) == 1  # asked once, whatever is asked of it
    other = device(tmp_path, "dev-b")  # another device has not been asked: its answer is its own
    deploy(other, bundle)
    assert run_mod.takes_flag(other, bundle, "dump_logits_path") is takes
    assert len(other.help_calls()) == 1


def test_the_farms_host_runner_takes_its_own_flags_without_being_asked(tmp_path):
    dev = device(tmp_path, "dev-a")
    bundle = deployed(tmp_path, dev, "h", HOST_RUNNER, dialect="host")
    assert run_mod.takes_flag(dev, bundle, "dump_logits_path")
    assert run_mod.takes_flag(dev, bundle, "token_ids_path")
    assert not run_mod.takes_flag(dev, bundle, "shared_buffer")
    assert dev.help_calls() == []


# -- a --help that does not finish ----------------------------------------------------------------

def _hangs_at_help(command: str):
    if command.endswith("--help 2>&1"):
        return DeviceTimeout(f"device dev-a: command did not finish: {command[:40]}", serial="dev-a")
    return None


@pytest.fixture
def hung(tmp_path, monkeypatch):
    monkeypatch.setattr(run_mod, "_CANNOT_START", {})
    dev = device(tmp_path, "dev-a")
    bundle = deployed(tmp_path, dev, "hangs", QNN_V1_0_1)
    dev.fail = _hangs_at_help
    return dev, bundle


def test_a_help_that_hangs_while_the_device_answers_is_the_runner_killed_by_its_pid(hung):
    dev, bundle = hung
    with pytest.raises(RunnerCannotStart) as caught:
        run_mod.runner_dialect(dev, bundle, timeout=7)
    assert "its --help did not finish in 7 s while the device answered (it hangs at start)" in \
        str(caught.value)
    shells = [(c, t) for what, c, t in dev.calls if what == "shell"]
    after = shells[[c for c, _ in shells].index(dev.help_calls()[-1]) + 1:]
    assert after[0] == ("true", run_mod.ALIVE_TIMEOUT_S)  # the device is asked whether it answers
    kill, timeout = after[1]
    pidfile = posixpath.join(bundle_workspace(dev, bundle), run_mod.HELP_PIDFILE)
    assert timeout == run_mod.KILL_TIMEOUT_S
    # The pid is killed only while its command line still names the runner; the pid file goes.
    assert kill == (f"pid=$(cat {shlex.quote(pidfile)} 2>/dev/null) && [ -n \"$pid\" ] && grep -qF -- "
                    f"{shlex.quote(bundle.runner)} /proc/$pid/cmdline 2>/dev/null && kill -9 $pid; "
                    f"rm -f {shlex.quote(pidfile)}; true")
    calls = len(dev.calls)  # remembered: the next test of this bundle here is told at once
    with pytest.raises(RunnerCannotStart):
        run_mod.runner_dialect(dev, bundle, timeout=7)
    assert len(dev.calls) == calls


def test_a_help_that_hangs_on_a_device_that_answers_nothing_stays_the_devices_timeout(hung):
    dev, bundle = hung
    dev.fail = lambda command: DeviceTimeout(
        "device dev-a: no answer to " + ("its help" if command.endswith("--help 2>&1") else command),
        serial="dev-a")
    with pytest.raises(DeviceTimeout) as caught:
        run_mod.runner_dialect(dev, bundle, timeout=7)
    assert not isinstance(caught.value, RunnerCannotStart)
    assert str(caught.value) == "device dev-a: no answer to its help"  # not the 'true' after it
    assert run_mod._CANNOT_START == {}  # nothing remembered against the bundle


def test_a_hung_help_whose_kill_fails_is_still_the_runners_fault(hung, caplog):
    dev, bundle = hung
    dev.fail = lambda command: (_hangs_at_help(command) or
                                (AdbError("device dev-a: kill refused", serial="dev-a")
                                 if "kill -9" in command else None))
    with caplog.at_level("WARNING", logger="farm.execute.run"), \
            pytest.raises(RunnerCannotStart) as caught:
        run_mod.runner_dialect(dev, bundle, timeout=7)
    # What the device said is the timeout's own story; the failed kill is a warning beside it.
    timed_out = str(_hangs_at_help(dev.help_calls()[-1]))
    assert caught.value.said == timed_out
    assert str(caught.value) == (
        f"{bundle.manifest_path}: runner ./qnn_llama_runner on dev-a cannot start: its --help did not "
        f"finish in 7 s while the device answered (it hangs at start); the device said: {timed_out}; "
        f"the bundle is at fault, not the device: fix its runner or libraries and create it again")
    assert [r.getMessage() for r in caplog.records if r.name == "farm.execute.run"] == \
        ["device dev-a: killing a hung --help failed: device dev-a: kill refused"]


def test_a_runner_the_shell_cannot_run_and_that_says_nothing_is_told_so(tmp_path, monkeypatch):
    monkeypatch.setattr(run_mod, "_CANNOT_START", {})
    dev = device(tmp_path, "dev-a")
    bundle = deployed(tmp_path, dev, "silent", "")
    (Path(bundle_workspace(dev, bundle)) / bundle.runner).write_text("#!/bin/sh\nexit 127\n")
    with pytest.raises(RunnerCannotStart) as caught:
        run_mod.runner_dialect(dev, bundle, timeout=30)
    assert caught.value.said == "" and caught.value.culprit == "./qnn_llama_runner"
    assert str(caught.value) == (
        f"{bundle.manifest_path}: runner ./qnn_llama_runner on dev-a cannot start: the shell cannot "
        f"run it (exit 127); the device said: (nothing); the bundle is at fault, not the device: fix "
        f"its runner or libraries and create it again")


@pytest.mark.parametrize("library, in_bundle", [("libqnn_executorch_backend.so", True),
                                                ("libQnnSystem.so", False)],
                         ids=["a file of the bundle", "a file the bundle lacks"])
def test_a_runner_the_linker_refuses_names_the_file_and_where_the_bundle_has_it(tmp_path, monkeypatch,
                                                                               library, in_bundle):
    monkeypatch.setattr(run_mod, "_CANNOT_START", {})
    said = f'CANNOT LINK EXECUTABLE "./qnn_llama_runner": library "{library}" not found\n'
    dev = device(tmp_path, "dev-a")
    bundle = deployed(tmp_path, dev, "unlinked", said)
    with pytest.raises(RunnerCannotStart) as caught:
        run_mod.runner_dialect(dev, bundle, timeout=30)
    mine = next((f.path for f in bundle.files if f.name == library), None)
    assert (mine is not None) is in_bundle
    where = (f"the file it names, {library}, is the bundle's {mine}" if in_bundle else
             f"the file it names, {library}, is not in the bundle")
    assert str(caught.value) == (
        f"{bundle.manifest_path}: runner ./qnn_llama_runner on dev-a cannot start: the dynamic linker "
        f"refuses it; {where}; the device said: {said.strip()}; the bundle is at fault, not the "
        f"device: fix its runner or libraries and create it again")
    assert (caught.value.serial, caught.value.runner, caught.value.culprit) == \
        ("dev-a", "./qnn_llama_runner", library)


def test_what_the_device_said_is_its_lines_joined_each_cut_short_and_the_end_kept(tmp_path, monkeypatch):
    # One line for a report's message: the output's non-blank lines joined by " | ", each cut to 300
    # characters, and of a long story the last 1200 (where the linker's verdict is).
    monkeypatch.setattr(run_mod, "_CANNOT_START", {})
    chatter = [f"loading step {i}: " + "x" * 400 for i in range(6)]
    verdict = 'CANNOT LINK EXECUTABLE "./qnn_llama_runner": library "libfoo.so" not found'
    dev = device(tmp_path, "dev-a")
    bundle = deployed(tmp_path, dev, "chatty", "\n".join(chatter) + "\n\n  " + verdict + "\n")
    with pytest.raises(RunnerCannotStart) as caught:
        run_mod.runner_dialect(dev, bundle, timeout=30)
    said = " | ".join([line[:300] for line in chatter] + [verdict])[-1200:]
    assert caught.value.said == said and said.endswith(" | " + verdict)
    assert len(said) == 1200
