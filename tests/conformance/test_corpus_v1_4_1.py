"""The conformance corpus' v1.4.1 half (corpus_v1_4_1.toml): what qnn_llama_runner v1.4.1 writes and
takes, against (a) the farm's side of dialect qnn-v1.4 and (b) farm-llama-runner shown as v1.4.1.

Each check cites the corpus entry it reads; the entries cite the C++ at tag v1.4.1."""

from __future__ import annotations

import ast
import json
import tomllib
from pathlib import Path

import pytest

from farm.execute.run import parse_observers
from farm.execute.runprofile import detect_dialect, help_flags
from farm.runner import main as runner_main
from farm.runner.engine import Stats
from farm.runner.releases import EMULATE, V1_4_1
from farm.vocab import Dialect
from tests.support.bundle_v14 import tiny_v14_bundle  # noqa: F401  (a fixture)
from tests.support.runner import paths

CORPUS = tomllib.loads(Path(__file__).with_name("corpus_v1_4_1.toml").read_text(encoding="utf-8"))
FAMILIES: list[str] = CORPUS["families"]["names"]
AS_V1_4_1 = EMULATE + "v1.4.1"


def _ids(kind: str):
    return lambda e: f"{e['family']}{'+system' if e.get('system_prompt') else ''}" if "family" in e \
        else e.get("name", kind)


def each(kind: str):
    table = CORPUS
    for part in kind.split("."):
        table = table[part]
    return pytest.mark.parametrize("case", table, ids=_ids(kind))


def run_v1_4_1(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        runner_main.main([AS_V1_4_1, *[str(a) for a in argv]])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


# -- the corpus itself --------------------------------------------------------------------------------

def test_every_entry_cites_a_source_of_this_tag():
    keys = set(CORPUS["sources"])
    assert CORPUS["tag"] == "v1.4.1"
    for kind in ("echo", "eos"):
        for entry in CORPUS[kind]:
            assert entry["source"].split(":")[0] in keys, entry
    assert {e["family"] for e in CORPUS["echo"]} == set(FAMILIES) == {e["family"] for e in CORPUS["eos"]}


def test_the_wheels_decoder_model_versions_are_the_runners_and_the_multimodal_runners():
    """decoder_constants.py (the wheel's, read as text: importing its package needs what the wheel
    lacks): its 20 keys map to 16 values, 13 of them qnn_llama_runner's, 3 the multimodal runner's."""
    import executorch

    path = Path(executorch.__path__[0]) / "examples/qualcomm/oss_scripts/llama/decoder_constants.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    [versions] = [ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                  and any(getattr(t, "id", "") == "DECODER_MODEL_VERSION" for t in n.targets)]
    assert len(versions) == 20 and len(set(versions.values())) == 16
    assert set(versions.values()) == set(FAMILIES) | set(CORPUS["families"]["multimodal"])


# -- (a) the farm's side of qnn-v1.4 ------------------------------------------------------------------

def test_the_farm_knows_v1_4_1s_families_and_no_other():
    from farm.model.template import FAMILIES_V1_4_1

    assert list(FAMILIES_V1_4_1) == FAMILIES


@each("echo")
def test_qnn_v1_4_formats_each_familys_echo(case):
    from farm.model.template import format_prompt

    upstream = Dialect.QNN_V1_4.templates
    assert format_prompt(case["prompt"], case["system_prompt"], case["family"], upstream) == case["echo"]


@each("eos")
def test_qnn_v1_4_ends_each_family_on_its_marker(case):
    from farm.model.template import FAMILIES_V1_4_1

    assert (FAMILIES_V1_4_1[case["family"]].end_marker or "") == case["marker"]


@pytest.mark.parametrize("version", ["granite_speech", "smolvlm", "internvl3", "mistral"])
def test_a_version_qnn_llama_runner_does_not_take_is_refused_naming_what_it_takes(version):
    from farm.errors import UsageError
    from farm.model.template import format_prompt

    with pytest.raises(UsageError, match=f"unsupported '{version}' \\(qnn_llama_runner v1.4.1 knows llama2, ") as e:
        format_prompt("P", "", version, "v1.4.1")
    assert ("qnn_multimodal_runner" in str(e.value)) == (version in CORPUS["families"]["multimodal"])


@pytest.mark.parametrize("case", [e for e in CORPUS["echo"] if not e["system_prompt"]], ids=_ids("echo"))
def test_generated_text_strips_v1_4_1s_echo(case):
    from suites.test_correctness import generated_text

    generation = "Paris is the capital of France."
    assert generated_text(case["echo"] + generation, case["prompt"], case["family"], "v1.4.1") == generation


@each("observer.example")
def test_the_farm_reads_v1_4_1s_observer_line(case):
    (parsed,) = parse_observers(case["line"] + "\n")
    assert [k for k in CORPUS["observer"]["keys"] if k in parsed] == list(parsed)
    assert {k: parsed[k] for k in case["stats"]} == case["stats"]


def test_the_farm_tells_v1_4_1_by_its_help(capsys):
    code, out, _ = run_v1_4_1(["--help"], capsys)
    assert code == 1
    assert detect_dialect(out) is Dialect.QNN_V1_4
    flags = help_flags(out)
    assert set(CORPUS["flags"]["names"]) <= flags and not set(CORPUS["flags"]["removed"]) & flags
    assert not {"token_ids_path", "seed"} & flags  # farm-llama-runner's own flags are not v1.4.1's


# -- (b) farm-llama-runner shown as v1.4.1 ------------------------------------------------------------

def test_its_flags_are_exactly_qnn_llama_runners():
    own = [f.name for f in V1_4_1.flags if f.file is None]
    assert own == CORPUS["flags"]["names"]  # in QLR's order, nothing added, nothing left out


@each("observer.example")
def test_its_observer_line_is_v1_4_1s(case):
    stats = Stats(**case["stats"])
    assert stats.observer_line(rates=True) == case["line"]
    assert stats.observer_line() != case["line"] or "token_per_sec" not in case["line"]


@pytest.mark.parametrize("flag", ["--kv_updater", "--token_ids_path", "-seed"])
def test_a_flag_v1_4_1_does_not_define_is_gflags_error(flag, capsys):
    code, out, err = run_v1_4_1([flag, "x", "--prompt", "hi"], capsys)
    assert code == CORPUS["flags"]["unknown_flag_exit"] and out == ""
    assert err == f"ERROR: unknown command line flag '{flag.lstrip('-')}'\n"
    if flag == "--kv_updater":
        assert err.rstrip("\n") == CORPUS["flags"]["unknown_flag_error"]


@pytest.fixture()
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_kv_mode_runs_kv_forward_so_a_v1_0_1_kv_program_is_refused(tiny_bundle, in_tmp, capsys):
    """RUN:165-169: eval_mode 0 loads kv_forward, which v1.0.1's kv program (one `forward`) lacks: the
    run fails as a phone's v1.4.1 runner fails on it, naming the method."""
    pte, tok = paths(tiny_bundle, "kv")
    code, out, err = run_v1_4_1(["--model_path", pte, "--tokenizer_path", tok, "--eval_mode", "0",
                                 "--shared_buffer", "--prompt", "Once"], capsys)
    assert code == 2 and f"has no method '{CORPUS['methods']['kv']}'" in err


def test_a_v1_0_1_hybrid_program_is_refused_as_not_of_1_4_1s_layout(tiny_bundle, in_tmp, capsys):
    pte, tok = paths(tiny_bundle, "hybrid")
    code, out, err = run_v1_4_1(["--model_path", pte, "--tokenizer_path", tok, "--eval_mode", "1",
                                 "--prompt", "Once"], capsys)
    assert code == 2 and "is in v1.0.1's I/O layout" in err


def test_a_hybrid_run_takes_shared_buffer_and_writes_what_v1_4_1_writes(tiny_v14_bundle, in_tmp, capsys):
    """--shared_buffer is taken (a zero-copy choice with nothing to choose on the host); the echo is
    v1.4.1's template (smollm2's opens the assistant's turn, QLR:175-185), stdout has one newline before
    each observer line even when seq_len ends the generation (TOK:344-353), the observer line v1.4.1's."""
    pte, tok = paths(tiny_v14_bundle, "hybrid")
    case = next(e for e in CORPUS["echo"] if e["family"] == "smollm2_135m" and not e["system_prompt"])
    code, out, err = run_v1_4_1(["--model_path", pte, "--tokenizer_path", tok, "--eval_mode", "1",
                                 "--decoder_model_version", "smollm2_135m", "--shared_buffer",
                                 "--prompt", case["prompt"], "--seq_len", "96"], capsys)
    assert code == 0, err
    assert (in_tmp / "outputs.txt").read_bytes().startswith(case["echo"].encode())
    lines = out.split("\n")
    observer_at = [i for i, line in enumerate(lines) if line.startswith(CORPUS["observer"]["prefix"])]
    assert len(observer_at) == 1 and lines[:observer_at[0]] == [""]  # one newline, then the line
    assert len((in_tmp / "outputs.txt").read_bytes()) > len(case["echo"])
    stats = json.loads(lines[observer_at[0]][len(CORPUS["observer"]["prefix"]):])
    assert [k for k in CORPUS["observer"]["keys"] if k in stats] == list(stats)
    assert "decode_token_per_sec" in stats


# -- qnn_multimodal_runner ------------------------------------------------------------------------------

def test_multimodal_flags_are_qmrs():
    from farm.runner.releases import GFLAGS_SRC, MULTIMODAL_V1_4_1

    spec = CORPUS["multimodal"]["flags"]
    own = [f.name for f in MULTIMODAL_V1_4_1.flags if not (f.file or "").startswith(GFLAGS_SRC)]
    assert own == spec["names"]
    assert not set(spec["absent"]) & {f.name for f in MULTIMODAL_V1_4_1.flags}


def test_multimodal_methods_are_mmrs():
    from farm.runner import multimodal

    spec = CORPUS["multimodal"]["methods"]
    assert multimodal.ENCODER_METHOD == spec["encoder"]
    assert list(multimodal.TOK_EMBEDDING_METHODS[0]) == spec["tok_embedding_kv"]
    assert list(multimodal.TOK_EMBEDDING_METHODS[1]) == spec["tok_embedding_hybrid"]


@pytest.mark.parametrize("entry", CORPUS["multimodal"]["template"], ids=lambda e: e["family"])
def test_multimodal_templates_are_vcts(entry):
    from farm.model.template import format_vision_prompt

    assert format_vision_prompt(entry["prompt"], entry["system_prompt"], entry["family"]) == entry["formatted"]


def test_multimodal_end_markers_are_mmrs():
    from farm.model.template import VISION_END_MARKERS

    spec = {k: v for k, v in CORPUS["multimodal"]["eos"].items() if k != "source"}
    assert VISION_END_MARKERS == spec


@pytest.mark.parametrize("entry", CORPUS["multimodal"]["error"], ids=lambda e: e["what"])
def test_multimodal_errors_are_upstreams(entry, tmp_path):
    from farm.errors import UsageError
    from farm.runner import multimodal

    with pytest.raises(UsageError) as e:
        if entry["what"].startswith("no --image_path"):
            multimodal.require_input_list("", "vision")
        elif entry["what"].startswith("an image file"):
            short = tmp_path / "short.raw"
            short.write_bytes(b"\0" * 100)
            multimodal.load_image(str(short), [1, 3, 32, 32])
        else:
            multimodal.prepare_messages(["<image><image>x"], ["a.raw"])
    assert entry["message"] in str(e.value)
