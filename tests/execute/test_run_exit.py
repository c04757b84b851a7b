"""A runner's exit code is the verdict, whatever files it left (FakeDevice: no adb).

Any non-zero exit is ``RunnerFailed``: the code under test failed (a test failure, exit code
TEST_FAILURE), never a pass and never infra, also when the runner wrote every output first (a crash
in teardown, a failed check after generating) and also for exit 1, the code of gflags, abort paths and
most failed ``main``s. Only exit 0 with outputs is a result.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from farm.bundle import manifest as bundle_mod
from farm.errors import InfraError, RunIncomplete
from farm.execute.compare import compare_updaters
from farm.execute.deploy import bundle_workspace, deploy
from farm.execute.run import RunnerFailed, run
from farm.execute.runprofile import RunRequest
from farm.exitcodes import ExitCode, for_error
from tests.support.devices import make_qnn_bundle
from tests.support.fake_device import FakeDevice

TEXT = "Once upon a time there was a llama"
OBSERVER = {"prompt_tokens": 4, "generated_tokens": 9, "inference_start_ms": 0,
            "prompt_eval_end_ms": 100, "first_token_ms": 100, "inference_end_ms": 500}

# A runner that takes the farm's flags, optionally does all its work (outputs.txt, the speed file, the
# observer line on stdout) and then exits with the given code, saying so on stderr.
EXITING_RUNNER = r"""#!/bin/sh
out=""; speed=""
while [ $# -gt 0 ]; do
  case "$1" in
    --output_path) out="$2"; shift ;;
    --performance_output_path) speed="$2"; shift ;;
  esac
  shift
done
if [ @OUTPUTS@ = yes ]; then
  printf '%s' '@TEXT@' > "$out"
  echo 42.5 > "$speed"
  echo 'PyTorchObserver @OBSERVER@'
fi
echo "runner: finished with status @CODE@" >&2
exit @CODE@
"""


@pytest.fixture
def deployed(tmp_path):
    bundle = bundle_mod.load(make_qnn_bundle(tmp_path / "bundle", name="exits"))
    device = FakeDevice(tmp_path / "device", serial="fake-exit")
    deploy(device, bundle)
    return device, bundle


def _install_runner(device: FakeDevice, bundle, *, code: int, outputs: bool) -> None:
    """Replace the deployed runner by EXITING_RUNNER (the deploy made it executable)."""
    script = (EXITING_RUNNER.replace("@OUTPUTS@", "yes" if outputs else "no")
              .replace("@TEXT@", TEXT).replace("@OBSERVER@", json.dumps(OBSERVER))
              .replace("@CODE@", str(code)))
    (Path(bundle_workspace(device, bundle)) / bundle.runner).write_text(script)


def test_the_exiting_runner_passes_when_it_exits_0_with_outputs(deployed):
    """The control: the same runner, exit 0, is a result with its outputs (so the failures below fail
    for their exit code, not because the stand-in is broken)."""
    device, bundle = deployed
    _install_runner(device, bundle, code=0, outputs=True)
    result = run(device, bundle, RunRequest(prompts=["hi"]), timeout=60)
    assert result.exit_code == 0 and result.text == TEXT
    assert result.tokens_per_s == 42.5 and result.observer == OBSERVER


@pytest.mark.parametrize("outputs", [True, False], ids=["with outputs", "without outputs"])
@pytest.mark.parametrize("code", [1, 2, 42, 255])
def test_a_non_zero_exit_is_runner_failed_whatever_the_runner_wrote(deployed, code, outputs):
    device, bundle = deployed
    _install_runner(device, bundle, code=code, outputs=outputs)
    with pytest.raises(RunnerFailed) as caught:
        run(device, bundle, RunRequest(prompts=["hi"]), timeout=60)
    e = caught.value
    assert isinstance(e, AssertionError)  # a test failure ...
    assert not isinstance(e, (InfraError, RunIncomplete))  # ... not the farm's, not a retry
    assert for_error(e) == ExitCode.TEST_FAILURE
    assert f"exited {code}: runner: finished with status {code}" in str(e)
    assert e.result.exit_code == code
    if outputs:  # what it wrote is kept for the report, but it is not a pass
        assert e.result.text == TEXT and e.result.observer == OBSERVER
    else:
        assert e.result.text is None


def test_an_updater_comparison_with_a_runner_exiting_1_is_no_comparison(deployed):
    """Both updaters' runs write identical outputs and exit 1: no agreement can come of it."""
    device, bundle = deployed
    _install_runner(device, bundle, code=1, outputs=True)
    with pytest.raises(RunnerFailed, match="exited 1"):
        compare_updaters(device, bundle, mode="kv", prompt="hi", seq_len=16)
