"""The reference bundle through a virtual device and adb equals the host runner run directly."""

from __future__ import annotations

import json
import subprocess

import pytest

from farm.bundle import manifest as bundle_mod
from farm.device.discovery import find_device
from farm.execute.deploy import deploy
from farm.execute.run import run
from farm.execute.runprofile import RunRequest, runner_argv

PLAIN = "Once upon a time"
HOSTILE = "Tom's \"ball\" $(rm -rf /) `id`; echo é 日本 🦙\nnext line"


@pytest.fixture(scope="module")
def deployed(shared_virtual_farm, tiny_bundle):
    vf = shared_virtual_farm
    device = find_device([vf.adb_server], vf.devices[0].serial)
    bundle = bundle_mod.load(tiny_bundle)
    deploy(device, bundle)
    return device, bundle


def _host_run(bundle, request, tmp_path) -> tuple[bytes, dict]:
    """farm-llama-runner on this host, with the very argv the device got, in the bundle's folder."""
    argv, _ = runner_argv(bundle, request, str(tmp_path))
    proc = subprocess.run(argv, cwd=bundle.manifest_path.parent, capture_output=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    return ((tmp_path / "outputs.txt").read_bytes(),
            json.loads((tmp_path / "token_ids.json").read_text()))


@pytest.mark.parametrize("mode, updater, prompt", [
    ("kv", "SmartMask", PLAIN),
    ("hybrid", "ShiftPointer", HOSTILE),
])
def test_device_run_equals_host_run(deployed, tmp_path, mode, updater, prompt):
    device, bundle = deployed
    request = RunRequest(prompts=[prompt], mode=mode, updater=updater, seq_len=100)
    result = run(device, bundle, request, timeout=300)
    host_text, host_ids = _host_run(bundle, request, tmp_path)
    assert result.generated_ids and result.generated_ids == host_ids["generated_ids"]
    assert result.prompt_ids == host_ids["prompt_ids"]
    assert result.text_bytes == host_text
    assert prompt.encode() in result.text_bytes  # the echoed prompt arrived byte-exact
    assert result.tokens_per_s and result.tokens_per_s > 0
    # As upstream counts: the decode loop's tokens, not the one prefill produced.
    assert result.observer["generated_tokens"] == len(result.generated_ids) - 1


def test_both_updaters_agree_through_the_device(deployed):
    device, bundle = deployed
    ids = {u: run(device, bundle, RunRequest(prompts=[PLAIN], mode="hybrid", updater=u, seq_len=40),
                  timeout=300).generated_ids for u in ("SmartMask", "ShiftPointer")}
    assert ids["SmartMask"] and ids["SmartMask"] == ids["ShiftPointer"]
