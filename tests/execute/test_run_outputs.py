"""What a run hands back besides its text (FakeDevice: no adb): the logits dump with the dtype its
runner's dialect writes, and a library refused while the runner runs told as the bundle's fault."""

from __future__ import annotations

import pytest

from farm.bundle import manifest as bundle_mod
from farm.errors import InfraError
from farm.execute import run as run_mod
from farm.execute.deploy import deploy
from farm.execute.run import RunnerCannotStart, RunnerFailed, logits_dtype, run
from farm.execute.runprofile import Dialect, RunRequest
from tests.execute.run_support import RecordingDevice, scripted, scripted_bundle
from tests.support.devices import make_qnn_bundle
from tests.support.fake_device import FakeDevice
from tests.support.runner_help_texts import HOST_RUNNER, QNN_V1_0_1


@pytest.fixture
def deployed(tmp_path, monkeypatch):
    # What a device said of a bundle is remembered per process: each test asks afresh.
    monkeypatch.setattr(run_mod, "_CANNOT_START", {})
    monkeypatch.setattr(run_mod, "_HELP", {})
    bundle = bundle_mod.load(make_qnn_bundle(tmp_path / "bundle", name="outputs"))
    device = FakeDevice(tmp_path / "device", serial="fake-out")
    deploy(device, bundle)
    return device, bundle


def test_each_dialect_names_the_dtype_of_its_logits():
    # The host runner dumps its model's float32 logits; qnn_llama_runner the quantized model's uint16.
    assert logits_dtype(Dialect.HOST) == "<f4"
    assert {logits_dtype(d) for d in Dialect if d != Dialect.HOST} == {"<u2"}


def test_a_logits_dump_comes_back_with_its_dtype_and_only_when_asked(deployed, tmp_path):
    device, bundle = deployed
    asked = run(device, bundle, RunRequest(prompts=["hi"], dump_logits=True), timeout=60,
                local_dir=tmp_path / "kept")
    assert asked.logits == bytes(range(16)) and asked.logits_dtype == "<u2"
    assert (tmp_path / "kept" / "logits.bin").read_bytes() == bytes(range(16))
    plain = run(device, bundle, RunRequest(prompts=["hi"]), timeout=60)
    assert plain.logits is None and plain.logits_dtype is None


@pytest.mark.parametrize(("help_text", "dtype"), [(HOST_RUNNER, "<f4"), (QNN_V1_0_1, "<u2")],
                         ids=["host runner", "qnn_llama_runner"])
def test_the_dtype_of_a_dump_is_that_of_the_dialect_the_runner_showed(tmp_path, monkeypatch,
                                                                      help_text, dtype):
    monkeypatch.setattr(run_mod, "_HELP", {})
    dev = RecordingDevice(tmp_path / "dev", serial="dev-logits")
    bundle = scripted_bundle(tmp_path / "bundle", "logits", help_text, dialect="auto")
    deploy(dev, bundle)
    result = run(dev, bundle, scripted(text="ok", ids={"generated_ids": [1]}, logits=b"\x01\x02\x03\x04",
                                       dump_logits=True), timeout=60)
    assert (result.logits, result.logits_dtype) == (b"\x01\x02\x03\x04", dtype)


def test_a_library_refused_while_running_is_the_bundles_fault_not_a_failed_test(deployed):
    # QNN opens libQnnHtp.so only once the model loads, after --help answered: the same story as a
    # linker refusal at start, naming the library and the bundle's file of that name.
    device, bundle = deployed
    with pytest.raises(RunnerCannotStart) as caught:
        run(device, bundle, RunRequest(prompts=["NOLIB"]), timeout=60)
    e = caught.value
    assert not isinstance(e, (RunnerFailed, InfraError))
    assert (e.serial, e.culprit) == ("fake-out", "libQnnHtp.so")
    assert 'dlopen failed: library "libQnnHtp.so" not found' in e.said
    assert (f"runner ./qnn_llama_runner on fake-out cannot start: it exited 1: a library it loads is "
            f"refused; the file it names, libQnnHtp.so, is the bundle's ") in str(e)
    assert "the bundle is at fault, not the device" in str(e)
