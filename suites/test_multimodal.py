"""Multimodal bundles (qnn_multimodal_runner, ExecuTorch 1.4.1): every mode writes its goldens' text
for each of the bundle's inputs at temperature 0, and a throughput point reports the decoder's rates
with the encoder's time apart. Goldens: the manifest's ``model.goldens`` file beside it (JSON, the
reference bundle's are the float model's, farm/bundle/export_vlm.py). Bundles without a
``multimodal`` section skip this suite."""

from __future__ import annotations

import json
import re

import pytest

from farm.errors import UsageError
from farm.model.template import IMAGE_TOKEN
from farm.vocab import Timing
from ptefarm_fixtures import ensure_run

pytestmark = [pytest.mark.gate, pytest.mark.release]

# farm/runner/multimodal.py's stderr line; a phone's runner prints none, and then nothing is recorded
ENCODER_LINE = re.compile(r"^ptefarm: encoder ([0-9.]+) ms \(host\)", re.M)


def _goldens(run) -> list[dict]:
    name = run.bundle.model.get("goldens")
    if not isinstance(name, str):
        return []
    path = run.manifest.parent / name
    try:
        goldens = json.loads(path.read_text(encoding="utf-8"))["goldens"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{path}: not a multimodal goldens file ({type(e).__name__}: {e})") from None
    for i, g in enumerate(goldens):
        for key, typ in (("input", str), ("prompt", str), ("seq_len", int), ("text", str)):
            if not isinstance(g.get(key), typ):
                raise UsageError(f"{path}: goldens[{i}].{key} must be a {typ.__name__}")
        if g["input"] not in run.bundle.multimodal.inputs:
            raise UsageError(f"{path}: goldens[{i}].input {g['input']!r} is not among the manifest's "
                             f"multimodal.inputs ({', '.join(sorted(run.bundle.multimodal.inputs))})")
    return goldens


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "mm_point" not in metafunc.fixturenames:
        return
    run = ensure_run(metafunc.config)
    if run.bundle.multimodal is None:
        metafunc.parametrize("mm_point", [pytest.param(None, id="text-only", marks=pytest.mark.skip(
            reason="not a multimodal bundle (no 'multimodal' section in its manifest)"))])
        return
    if metafunc.definition.originalname == "test_matches_golden":
        points = [(g, mode) for g in _goldens(run) for mode in sorted(run.bundle.modes)]
        if not points:
            metafunc.parametrize("mm_point", [pytest.param(None, id="no-goldens", marks=pytest.mark.skip(
                reason="the manifest names no goldens file (model.goldens)"))])
            return
        metafunc.parametrize("mm_point", points, ids=[f"{g['input']}-{mode}" for g, mode in points])
    else:
        first = sorted(run.bundle.multimodal.inputs)[0]
        metafunc.parametrize("mm_point", [(first, mode) for mode in sorted(run.bundle.modes)],
                             ids=[f"{first}-{mode}" for mode in sorted(run.bundle.modes)])


def test_matches_golden(llm, mm_point):
    golden, mode = mm_point
    result = llm.generate(golden["prompt"], mode=mode, seq_len=golden["seq_len"], media=golden["input"])
    text = result.text or ""
    echo_tail = golden["prompt"].replace(IMAGE_TOKEN, "")
    generated = text[text.find(echo_tail) + len(echo_tail):] if echo_tail in text else text
    # The template's closing ("<end_of_utterance>\nAssistant:") follows the prompt in the echo.
    if not text.endswith(golden["text"]):
        at = next((i for i, (a, b) in enumerate(zip(reversed(text), reversed(golden["text"]))) if a != b),
                  min(len(text), len(golden["text"])))
        pytest.fail(f"{llm.device.serial}: mode {mode}, input {golden['input']!r}: the generation is not "
                    f"the golden's ({len(golden['text'])} characters); they part {at} characters from "
                    f"the end: wrote ...{generated[-60:]!r}, golden ...{golden['text'][-60:]!r}")


def test_throughput_with_encoder_apart(llm, mm_point, record_measurement):
    media, mode = mm_point
    updater = llm.updaters[0]  # qnn_multimodal_runner has one (SmartMask)
    result = llm.generate(f"{IMAGE_TOKEN}Can you describe this image?", mode=mode, seq_len=96, media=media,
                          updater=updater)
    observer = result.observer or {}
    assert result.tokens_per_s is not None and result.tokens_per_s > 0, \
        f"{llm.device.serial}: mode {mode}: no inference_speed.txt figure"
    record_measurement("tok_s", "tok/s", [result.tokens_per_s], updater=updater, mode=mode, seq_len=96)
    for key in ("prefill_token_per_sec", "decode_token_per_sec", "prompt_tokens", "generated_tokens"):
        if key in observer:
            llm.record(key, observer[key])
    llm.record("timing", Timing(llm.device.timing).value)  # the plugin's own value: reports label it
    if m := ENCODER_LINE.search(result.stderr or ""):
        # Always the host's clock (the runner times its encoder call itself), whatever the decoder's
        # figures are: recorded under its own name so that it never reads as a phone's time.
        llm.record("encoder_ms_host", m.group(1))
