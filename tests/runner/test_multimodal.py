"""qnn_multimodal_runner v1.4.1 on the host (farm/runner/multimodal.py) with the reference vision-language
bundle (farm/bundle/export_vlm.py): in kv and hybrid mode it writes the tokens the float model generates
in eager PyTorch (the bundle's goldens: encoder, embeddings and full causal attention, no KV cache, no
merger), the image decides them, and a runner that merges the image's embeddings in the wrong place, or
leaves them out, is caught. Its surface is upstream's: flags, --help, the errors of utils.h and
chat_template.h, the argv the farm builds for a multimodal bundle.

Sources at tag v1.4.1, examples/qualcomm/oss_scripts/llama/: QMR = qnn_multimodal_runner.cpp,
CT = runner/multimodal_runner/chat_template.h, VCT = runner/multimodal_runner/vision_chat_template.h,
UT = runner/multimodal_runner/utils.h, DE = evaluator/device_evaluator.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from farm.bundle import export_vlm
from farm.bundle import manifest as bundle_mod
from farm.errors import UsageError
from farm.execute.runprofile import RunRequest, runner_argv
from farm.model.template import format_vision_prompt
from farm.runner import cli, multimodal
from farm.runner.releases import MULTIMODAL_V1_4_1
from tests.support.bundle_vlm import smolvlm_bundle  # noqa: F401  (a fixture)

EMULATE = "--ptefarm_upstream=multimodal-v1.4.1"


def _goldens(manifest: Path) -> dict[str, dict]:
    return {g["input"]: g for g in json.loads((manifest.parent / export_vlm.GOLDENS).read_text())["goldens"]}


def _golden_text(manifest: Path, ids: list[int]) -> bytes:
    from farm.model.tokenizer import load_tokenizer

    tok = load_tokenizer(manifest.parent / "tokenizer.json")
    return b"".join(tok.piece(t, p) for p, t in zip([ids[0], *ids[:-1]], ids))


def run_runner(manifest: Path, tmp_path: Path, *, mode: str = "kv", image: str = "gradient",
               prompt: str = export_vlm.GOLDEN_PROMPT, extra: list[str] = (), capfd=None) -> bytes:
    """The runner in this process, in the bundle's directory as on a device; outputs.txt's bytes."""
    bundle = bundle_mod.load(manifest)
    out = tmp_path / f"out-{mode}-{image}.txt"
    argv = [EMULATE, "--decoder_path", bundle.modes[mode].pte, "--encoder_path", export_vlm.ENCODER_PTE,
            "--tok_embedding_path", export_vlm.TOK_EMBEDDING_PTE, "--tokenizer_path", bundle.tokenizer,
            "--decoder_model_version", "smolvlm", "--prompt", prompt,
            "--image_path", export_vlm.input_list_file(image), "--seq_len", str(export_vlm.GOLDEN_SEQ_LEN),
            "--eval_mode", str(bundle.modes[mode].eval_mode), "--output_path", str(out),
            "--performance_output_path", str(tmp_path / "speed.txt"), "--shared_buffer", *extra]
    cwd = os.getcwd()
    os.chdir(manifest.parent)
    try:
        code = cli.run(argv)
    finally:
        os.chdir(cwd)
    assert code == 0
    return out.read_bytes()


@pytest.mark.parametrize("mode", ["kv", "hybrid"])
@pytest.mark.parametrize("image", list(export_vlm.IMAGES))
def test_tokens_are_the_float_models(smolvlm_bundle, tmp_path, mode, image):
    golden = _goldens(smolvlm_bundle)[image]
    text = run_runner(smolvlm_bundle, tmp_path, mode=mode, image=image)
    # The echo is the formatted prompt's text parts (QMR:514-516: <image> itself is never written).
    echo = format_vision_prompt(golden["prompt"], "", "smolvlm").replace("<image>", "").encode()
    assert text == echo + _golden_text(smolvlm_bundle, golden["generated_ids"])
    assert text == echo + golden["text"].encode()


def test_the_image_decides_the_tokens(smolvlm_bundle):
    goldens = _goldens(smolvlm_bundle)
    a, b = (goldens[name]["generated_ids"] for name in export_vlm.IMAGES)
    assert a != b  # else the golden test could pass on a runner that ignores the image


@pytest.mark.parametrize("broken", ["image_after_text", "no_image"])
def test_a_wrong_merge_is_caught(smolvlm_bundle, tmp_path, monkeypatch, broken):
    right = multimodal.dispatch

    def wrong(formatted, images):
        parts = right(formatted, images)
        text = [p for p in parts if isinstance(p, str)]
        pixels = [p for p in parts if not isinstance(p, str)]
        return text + pixels if broken == "image_after_text" else text

    monkeypatch.setattr(multimodal, "dispatch", wrong)
    golden = _goldens(smolvlm_bundle)["gradient"]
    text = run_runner(smolvlm_bundle, tmp_path)
    assert not text.endswith(_golden_text(smolvlm_bundle, golden["generated_ids"]))


def test_prompt_without_placeholder_gets_the_image_first():
    # CT prepare_messages: <image> per image prepended to the first prompt when none has one
    assert multimodal.prepare_messages(["Describe.", "And now?"], ["a.raw"]) == [
        ("<image>Describe.", ["a.raw"]), ("And now?", [])]
    assert multimodal.prepare_messages(["<image>x", "<image>y"], ["a", "b"]) == [("<image>x", ["a"]),
                                                                                ("<image>y", ["b"])]
    with pytest.raises(UsageError, match=r"Number of <image> tokens \(2\) does not match number of images \(1\)"):
        multimodal.prepare_messages(["<image><image>x"], ["a"])


def test_smolvlm_and_internvl3_templates():
    # VCT:66-101 and expand_image_tokens (VCT:42-64)
    assert format_vision_prompt("<image>Hi", "", "smolvlm") == (
        "<|im_start|>User:<fake_token_around_image><global-img><image><fake_token_around_image>Hi"
        "<end_of_utterance>\nAssistant:")
    assert format_vision_prompt("<image>Hi", "Be brief.", "internvl3") == (
        "<|im_start|>system<|im_end|>\n\nBe brief.<|im_end|><|im_start|>user:\n<img><image></img>Hi"
        "<|im_end|>assistant\n")
    with pytest.raises(UsageError, match="unsupported 'llama3'"):
        format_vision_prompt("x", "", "llama3")


def test_input_list_and_image_errors(smolvlm_bundle, tmp_path):
    lst = tmp_path / "list.txt"
    lst.write_bytes(b"a.raw b.raw\r\n\nc.raw\n")
    assert multimodal.load_input_list(str(lst), "image_path") == ["a.raw", "b.raw", "c.raw"]  # UT load_raw_files
    with pytest.raises(UsageError, match="Failed to open input list file"):
        multimodal.load_input_list(str(tmp_path / "none.txt"), "image_path")
    short = tmp_path / "short.raw"
    short.write_bytes(b"\0" * 100)
    # UT load_image's message, naming the file and both sizes
    with pytest.raises(UsageError, match=rf"file bytes: 100, expected bytes: 12288 \(file: {short}\)"):
        multimodal.load_image(str(short), [1, 3, 32, 32])
    pixels = (smolvlm_bundle.parent / export_vlm.image_file("gradient"))
    assert multimodal.load_image(str(pixels), [1, 3, 32, 32]).shape == (1, 3, 32, 32)


def test_missing_image_path_is_upstreams_error(smolvlm_bundle, tmp_path, capsys):
    argv = [EMULATE, "--decoder_path", str(smolvlm_bundle.parent / "kv_llama_qnn.pte"),
            "--encoder_path", str(smolvlm_bundle.parent / export_vlm.ENCODER_PTE),
            "--tok_embedding_path", str(smolvlm_bundle.parent / export_vlm.TOK_EMBEDDING_PTE),
            "--tokenizer_path", str(smolvlm_bundle.parent / "tokenizer.json"),
            "--decoder_model_version", "smolvlm", "--prompt", "hi", "--eval_mode", "0",
            "--output_path", str(tmp_path / "o.txt")]
    assert cli.exit_code(argv) == 2
    assert "For VLM, please specify image path." in capsys.readouterr().err  # QMR:196-199
    assert not (tmp_path / "o.txt").exists()  # nothing half-written


def test_help_is_qnn_multimodal_runners(capsys):
    assert cli.exit_code([EMULATE, "--help"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("qnn_multimodal_runner: Warning: SetUsageMessage() never called")
    names = [f.name for f in MULTIMODAL_V1_4_1.flags]
    for flag in ("decoder_path", "encoder_path", "tok_embedding_path", "image_path", "audio_path", "shared_buffer"):
        assert f"-{flag} (" in out and flag in names
    assert "kv_updater" not in out and "model_path" not in names
    # QMR:43-125: its own help texts, not qnn_llama_runner's
    words = " ".join(out.split())  # gflags wraps long help texts
    assert "Path to input image file. For Vision-Language models, please specify image path." in words
    assert "(Total number of iterations to run.) type: int32 default: 1" in words


def test_an_unknown_flag_is_gflags_error(capsys):
    assert cli.exit_code([EMULATE, "--model_path", "x.pte"]) == 1
    assert capsys.readouterr().err.strip() == "ERROR: unknown command line flag 'model_path'"


def test_the_farm_builds_upstreams_command(smolvlm_bundle):
    bundle = bundle_mod.load(smolvlm_bundle)
    argv, outputs = runner_argv(bundle, RunRequest(prompts=["<image>What is it?"], mode="hybrid",
                                                   media="pattern"), "runs/r1", "host")
    # DE:185-206 and _init_multimodal_base_cmd: the three programs, --shared_buffer, the input list
    assert argv[:2] == ["farm-llama-runner", EMULATE]
    pairs = dict(zip(argv[2::2], argv[3::2]))
    assert pairs["--decoder_path"] == "hybrid_llama_qnn.pte"
    assert pairs["--encoder_path"] == "vision_encoder_qnn.pte"
    assert pairs["--tok_embedding_path"] == "tok_embedding_qnn.pte"
    assert argv[argv.index("--image_path") + 1] == "image_pattern_input_list.txt"
    assert "--shared_buffer" in argv and "--kv_updater" not in argv and "--model_path" not in argv
    assert outputs == {"outputs": "outputs.txt", "speed": "inference_speed.txt"}
    with pytest.raises(UsageError, match="runs with one of its inputs"):
        runner_argv(bundle, RunRequest(prompts=["x"], mode="kv"), "runs/r1", "host")
    with pytest.raises(UsageError, match="not runner dialect 'qnn-v1.0'"):
        runner_argv(bundle, RunRequest(prompts=["x"], mode="kv", media="pattern"), "runs/r1", "qnn-v1.0")


def test_manifest_names_its_multimodal_files(smolvlm_bundle, tmp_path):
    import shutil

    copy = Path(shutil.copytree(smolvlm_bundle.parent, tmp_path / "bundle")) / "manifest.json"
    raw = json.loads(copy.read_text())
    raw["multimodal"]["encoder"] = "missing.pte"
    copy.write_text(json.dumps(raw))
    with pytest.raises(UsageError, match=r"multimodal: field 'encoder' \('missing.pte'\) is not among"):
        bundle_mod.load(copy)
    assert bundle_mod.load(smolvlm_bundle).multimodal.inputs == {
        name: export_vlm.input_list_file(name) for name in export_vlm.IMAGES}


def test_pixels_file_is_the_encoders_input(smolvlm_bundle):
    size = np.fromfile(smolvlm_bundle.parent / export_vlm.image_file("pattern"), dtype="<f4").size
    assert size == 3 * 32 * 32


def test_the_encoder_is_its_seeds_alone():
    """Two builds of the reference encoder under different global generator states are the same
    model: an export of one config is reproducible, so its cache key can stand for its content."""
    import torch

    from farm.model.config import VLM_CONFIGS
    from farm.model.vision import VisionEncoder

    cfg, vision = VLM_CONFIGS["tiny-smolvlm"]
    torch.manual_seed(1)
    a = VisionEncoder(vision, cfg.dim).state_dict()
    torch.manual_seed(2)
    b = VisionEncoder(vision, cfg.dim).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
