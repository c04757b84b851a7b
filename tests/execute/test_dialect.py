"""Runner dialects read from the runner itself: its --help (gflags or argparse) on the device."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from farm.bundle import manifest as bundle_mod
from farm.device.discovery import find_device
from farm.errors import UsageError
from farm.execute.deploy import bundle_workspace, deploy
from farm.execute.run import run, runner_dialect
from farm.execute.runprofile import RunRequest, detect_dialect, help_flags, runner_argv, settle_dialect
from farm.virtual import VirtualDeviceSpec, VirtualFarm
from farm.vocab import Dialect
from tests.support import runner_help_texts as runner_help
from tests.support.devices import make_qnn_bundle

# -- the pure part: help text -> dialect -------------------------------------------------------------

@pytest.mark.parametrize("text,dialect", [
    (runner_help.QNN_V0_6_0, Dialect.QNN_V1_0),
    (runner_help.QNN_V1_0_1, Dialect.QNN_V1_0),
    (runner_help.QNN_V1_1_0, Dialect.QNN_V1_4),
    (runner_help.HOST_RUNNER, Dialect.HOST),
])
def test_each_release_is_recognised(text, dialect):
    assert detect_dialect(text) is dialect


def test_the_real_host_runner_says_host():
    text = subprocess.run(["farm-llama-runner", "--help"], capture_output=True, text=True,
                          timeout=60).stdout
    assert detect_dialect(text) is Dialect.HOST


def test_v060_swapped_help_still_gets_the_flag_passed():
    # v0.6.0's gflags entry reads "-kv_updater (SmartMask) ... default: "How to update kv cache...""
    # the runner's own default is garbage, so even SmartMask (the farm's default) is passed explicitly.
    assert 'default: "How to update kv cache' in runner_help.QNN_V0_6_0
    dialect = detect_dialect(runner_help.QNN_V0_6_0)
    argv, _ = runner_argv(_bundle("auto"), RunRequest(prompts=["x"]), "runs/r", dialect)
    assert argv[argv.index("--kv_updater") + 1] == "SmartMask"
    assert "--shared_buffer" not in argv


def test_only_declared_flags_count_not_words_in_help_texts():
    # v1.1 with a help text that talks about the old flag, even at the start of a wrapped line.
    text = runner_help.QNN_V1_1_0.replace(
        "    -shared_buffer (Specifies",
        "    -legacy_note (ShiftPointer and\n      --kv_updater were removed in v1.1) type: bool\n"
        "      default: false\n    -shared_buffer (Specifies")
    assert "kv_updater" in text and "kv_updater" not in help_flags(text)
    assert detect_dialect(text) is Dialect.QNN_V1_4


def test_help_naming_no_dialect_flag_is_a_clear_error():
    with pytest.raises(UsageError, match="lists none of --token_ids_path, --kv_updater, "
                                         "--shared_buffer.*model_path"):
        detect_dialect("    -model_path (x) type: string default: \"a.pte\"\n")
    with pytest.raises(UsageError, match="--kv_updator.*predates ExecuTorch v0.6.0"):
        detect_dialect("    -kv_updator (How to update kv cache) type: string default: \"\"\n")
    with pytest.raises(UsageError, match="no flag at all"):
        detect_dialect("/system/bin/sh: ./qnn_llama_runner: not found\n")


def _bundle(dialect: str) -> bundle_mod.Bundle:
    files = [bundle_mod.BundleFile(n, Path("/x") / n, 1, "0" * 64, role=r)
             for n, r in (("kv.pte", "pte"), ("tok.model", "tokenizer"), ("qnn_llama_runner", "runner"))]
    return bundle_mod.Bundle(name="b", runner_dialect=dialect, tokenizer="tok.model", files=files,
                             modes={"kv": bundle_mod.Mode("kv.pte", 0, 1)}, runner="qnn_llama_runner",
                             manifest_path=Path("/bundles/b/manifest.json"))


def test_declared_dialect_checked_against_the_help():
    assert settle_dialect(_bundle("auto"), runner_help.QNN_V1_1_0, "S1") is Dialect.QNN_V1_4
    assert settle_dialect(_bundle("qnn-v1.0"), runner_help.QNN_V0_6_0, "S1") is Dialect.QNN_V1_0
    with pytest.raises(UsageError) as caught:
        settle_dialect(_bundle("qnn-v1.0"), runner_help.QNN_V1_1_0, "S1")
    message = str(caught.value)
    assert message.startswith("/bundles/b/manifest.json: runner ./qnn_llama_runner on S1")
    assert "'qnn-v1.0'" in message and "'qnn-v1.4'" in message and "--shared_buffer" in message
    # A runner whose help says nothing (a stand-in script) cannot contradict the manifest ...
    assert settle_dialect(_bundle("qnn-v1.4"), "usage: whatever\n", "S1") \
        is Dialect.QNN_V1_4
    # ... but then nothing tells an "auto" bundle's dialect either.
    with pytest.raises(UsageError, match="manifest.json: .*cannot tell its dialect.*'auto'"):
        settle_dialect(_bundle("auto"), "usage: whatever\n", "S1")


def test_an_auto_bundle_needs_a_device_before_a_command_line():
    with pytest.raises(UsageError, match="'auto' is read from the runner on a device"):
        runner_argv(_bundle("auto"), RunRequest(prompts=["x"]), "runs/r")


def test_manifest_auto_and_omitted_dialect(tmp_path):
    manifest = make_qnn_bundle(tmp_path / "a", dialect="auto")
    assert bundle_mod.load(manifest).runner_dialect == "auto"
    raw = json.loads(manifest.read_text())
    del raw["runner_dialect"]
    manifest.write_text(json.dumps(raw))
    assert bundle_mod.load(manifest).runner_dialect == "auto"  # a QNN runner can tell
    raw["runner_dialect"] = "qnn-v2"
    manifest.write_text(json.dumps(raw))
    with pytest.raises(UsageError, match=r"manifest.json: field 'runner_dialect' is 'qnn-v2'.*auto"):
        bundle_mod.load(manifest)
    del raw["runner_dialect"], raw["runner"]
    manifest.write_text(json.dumps(raw))
    with pytest.raises(UsageError, match="missing field 'runner_dialect'"):
        bundle_mod.load(manifest)


# -- on a virtual device ----------------------------------------------------------------------------

class Counting:
    """A device that counts the --help questions asked through it."""

    def __init__(self, device):
        self._device = device
        self.helps = 0

    def __getattr__(self, name):
        return getattr(self._device, name)

    def shell(self, command: str, **kw):
        self.helps += command.endswith("--help 2>&1")
        return self._device.shell(command, **kw)


@pytest.fixture(scope="module")
def device(tmp_path_factory):
    root = tmp_path_factory.mktemp("dialect")
    with VirtualFarm(home=root / "farm") as vf:
        (record,) = vf.up([VirtualDeviceSpec(soc="SM8650")])
        yield find_device([vf.adb_server], record.serial), root


def _argv(result) -> list[str]:
    return json.loads(result.text)["argv"]


@pytest.mark.parametrize("release,flag", [("QNN_V0_6_0", "--kv_updater"),
                                          ("QNN_V1_1_0", "--shared_buffer")])
def test_auto_bundle_runs_with_its_runners_dialect_asked_once(device, release, flag):
    dev, root = device
    # A workspace name that needs quoting: the --help command is built like the run's.
    manifest = make_qnn_bundle(root / release, name=f"auto {release} 'q' $(touch pwned)",
                               dialect="auto", runner_help=getattr(runner_help, release))
    bundle = bundle_mod.load(manifest)
    deploy(dev, bundle)
    counting = Counting(dev)
    first = run(counting, bundle, RunRequest(prompts=["hi"]), timeout=60)
    second = run(counting, bundle, RunRequest(prompts=["again"]), timeout=60)
    assert flag in _argv(first) and flag in _argv(second)
    assert ("--kv_updater" in _argv(first)) == (flag == "--kv_updater")
    assert counting.helps == 1  # cached for this runner on this device
    assert not list(Path(bundle_workspace(dev, bundle)).glob("pwned"))


def test_declared_dialect_contradicted_by_the_runner_is_refused_before_running(device):
    dev, root = device
    manifest = make_qnn_bundle(root / "liar", name="liar", dialect="qnn-v1.0",
                               runner_help=runner_help.QNN_V1_1_0)
    bundle = bundle_mod.load(manifest)
    deploy(dev, bundle)
    with pytest.raises(UsageError) as caught:
        run(dev, bundle, RunRequest(prompts=["hi"], updater="ShiftPointer"), timeout=60)
    message = str(caught.value)
    assert str(manifest) in message and dev.serial in message
    assert "'qnn-v1.0'" in message and "'qnn-v1.4'" in message
    ws = Path(bundle_workspace(dev, bundle))
    assert not (ws / "runs").exists() or not list((ws / "runs").iterdir())  # nothing ran


def test_runner_not_deployed_yet_is_asked_again(device):
    dev, root = device
    bundle = bundle_mod.load(make_qnn_bundle(root / "late", name="late", dialect="auto",
                                             runner_help=runner_help.QNN_V1_0_1))
    with pytest.raises(UsageError, match="cannot tell its dialect.*--help exited [12]: .*(can.t cd|cd: .*No such file)"):
        runner_dialect(dev, bundle)  # nothing deployed: the shell cannot find the runner
    deploy(dev, bundle)
    assert runner_dialect(dev, bundle) is Dialect.QNN_V1_0


def test_the_dialect_chooses_flags_never_the_binary():
    argv, _ = runner_argv(_bundle("qnn-v1.0"), RunRequest(prompts=["x"]), "runs/r", Dialect.HOST)
    assert argv[0] == "./qnn_llama_runner" and "--token_ids_path" in argv


def test_a_bundle_runner_speaking_the_host_dialect_is_what_runs(device):
    """A wrapper that passes --help through to farm-llama-runner reads as dialect host; the bundle's
    own runner must still be what executes, or its run passes without it ever being exercised."""
    dev, root = device
    bundle = bundle_mod.load(make_qnn_bundle(root / "wrapper", name="wrapper", dialect="auto",
                                             runner_help=runner_help.HOST_RUNNER))
    deploy(dev, bundle)
    assert runner_dialect(dev, bundle) is Dialect.HOST
    result = run(dev, bundle, RunRequest(prompts=["hi"]), timeout=60)
    report = json.loads(result.text)  # only the bundle's stand-in runner writes this report
    assert "--token_ids_path" in report["argv"] and report["prompts"] == ["hi"]
    assert Path(report["cwd"]).resolve() == Path(bundle_workspace(dev, bundle)).resolve()


def test_gflags_newer_double_dash_entries_are_flags_too():
    # gflags releases after 2.2.2 print "    --name (help)"; a runner built with one is still read.
    text = runner_help.QNN_V1_0_1.replace("\n    -", "\n    --")
    assert "kv_updater" in help_flags(text) and "shared_buffer" not in help_flags(text)
    assert detect_dialect(text) is Dialect.QNN_V1_0
    assert detect_dialect(runner_help.QNN_V1_1_0.replace("\n    -", "\n    --")) \
        is Dialect.QNN_V1_4
