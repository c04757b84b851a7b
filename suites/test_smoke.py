"""Smoke: the device answers, its workspace has room, the runner starts and loads every mode."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.gate, pytest.mark.release]

MIN_FREE_BYTES = 64 << 20  # room for run outputs and one more deploy of a small file


def test_device_answers(device):
    result = device.shell("echo ptefarm-$((6 * 7))", timeout=30)
    assert result.exit_code == 0 and result.out.strip() == "ptefarm-42", \
        f"{device.serial}: shell answered {result.out!r} (exit {result.exit_code})"


def test_workspace_has_room(deployed, device):
    free = device.adb.info().free_bytes
    if free is None:
        pytest.skip(f"{device.serial} does not report free space (df)")
    assert free >= MIN_FREE_BYTES, (f"{device.serial}: {free} bytes free in {deployed.workspace}, "
                                    f"need at least {MIN_FREE_BYTES}")


def test_runner_loads_every_mode(llm):
    # A multimodal bundle's prompt holds its image's rows too (the reference's: 16); its context bounds it.
    seq_len = 24 if llm.bundle.multimodal is None else 96
    for mode in llm.modes:
        result = llm.generate("Hi", mode=mode, seq_len=seq_len, updater=llm.updaters[0])
        assert result.text, f"{mode}: the runner wrote no output"
        if result.generated_ids is not None:
            assert result.generated_ids, f"{mode}: the runner generated no token"
