"""The reference programs in ExecuTorch 1.4.1's layout carry what 1.4.1 writes and reads.

Sources at tag v1.4.1, examples/qualcomm/oss_scripts/llama/: SL = model/static_llama.py, UT = utils.py
(retrieve_info_from_pte, called here as the wheel ships it), RUN = runner/runner.cpp, LW =
wrappers/llm_wrappers.py, LP = llama.py.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from farm.bundle import manifest as bundle_mod
from farm.bundle.export import bundle_dir as v10_bundle_dir
from farm.bundle.export import export_bundle as export_v10
from farm.bundle.export_v14 import bundle_dir as v14_bundle_dir
from farm.model.config import CONFIGS
from tests.support.bundle_v14 import tiny_v14_bundle  # noqa: F401  (a fixture)

CFG = CONFIGS["tiny"]
# SL:807-824, the decode model's get_metadata() (LW:1044 writes it as the constant methods), with
# get_kv_io_bit_width 32 for a float program, plus the float logits' identity quantization that UT:44-47
# reads (UT:53-56 substitutes 1 and 0 for a 32-bit program).
METADATA = {"get_ar_len": 1, "get_bos_id": 1, "get_eos_id": 2, "get_dim": 64, "get_head_dim": 16,
            "get_max_batch_size": 1, "get_max_seq_len": 128, "get_max_context_len": 128,
            "get_n_bos": 1, "get_n_eos": 1, "get_n_kv_heads": 2, "get_n_layers": 2,
            "get_vocab_size": None, "get_use_kv_cache": True, "get_kv_io_bit_width": 32,
            "get_logits_scale": 1.0, "get_logits_zero_point": 0}
# LP:684-697's file names; the methods of each (decoder_constants.py DECODER_GRAPH_NAMES, LW:985-987)
# and their ar_lens (base_component.py:93-104: lookahead's next_power_of_two((4 + 4) * (3 - 1)) = 16).
PROGRAMS = {"kv": ("kv_llama_qnn.pte", {"kv_forward": 1}),
            "hybrid": ("hybrid_llama_qnn.pte", {"kv_forward": 1, "prefill_forward": 16}),
            "lookahead": ("lookahead_llama_qnn.pte", {"kv_forward": 16, "prefill_forward": 16})}


def program_path(manifest: Path, mode: str) -> Path:
    b = bundle_mod.load(manifest)
    return next(f.path for f in b.files if f.name == b.modes[mode].pte)


def constants(pte: Path) -> dict[str, object]:
    """Every constant method's value, read from the flatbuffer as UT:30-49 reads them."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(pte.read_bytes()).program
    out = {}
    for plan in program.execution_plan:
        if plan.name.startswith("get_"):
            out[plan.name] = plan.values[0].val
    return out


def n_words(manifest: Path) -> int:
    from farm.model.tokenizer import load_tokenizer

    b = bundle_mod.load(manifest)
    return load_tokenizer(next(f.path for f in b.files if f.name == b.tokenizer)).n_words


@pytest.mark.parametrize("mode", PROGRAMS)
def test_each_program_has_exactly_the_methods_of_1_4_1(tiny_v14_bundle, mode):
    from executorch.runtime import Runtime

    name, methods = PROGRAMS[mode]
    pte = program_path(tiny_v14_bundle, mode)
    assert pte.name == name
    program = Runtime.get().load_program(pte)
    assert set(program.method_names) == set(methods) | set(METADATA)


@pytest.mark.parametrize("mode", PROGRAMS)
def test_the_metadata_values_are_what_1_4_1_writes(tiny_v14_bundle, mode):
    values = constants(program_path(tiny_v14_bundle, mode))
    expected = dict(METADATA, get_vocab_size=n_words(tiny_v14_bundle),
                    get_ar_len=PROGRAMS[mode][1]["kv_forward"])  # the decode model's (LW:1044)
    got = {k: (v.double_val if hasattr(v, "double_val") else
               v.bool_val if hasattr(v, "bool_val") else v.int_val) for k, v in values.items()}
    assert got == expected
    # The scale is a double, as UT:45 reads it; the zero point an int (UT:47).
    assert hasattr(values["get_logits_scale"], "double_val")
    assert hasattr(values["get_logits_zero_point"], "int_val")


@pytest.mark.parametrize("mode", PROGRAMS)
def test_the_wheels_retrieve_info_from_pte_reads_them(tiny_v14_bundle, mode):
    # utils.py imports without the QNN backend once its package's heavy __init__ is bypassed.
    from farm.model.upstream_llama import PACKAGE, static_llama

    static_llama()
    utils = importlib.import_module(f"{PACKAGE}.utils")
    info = utils.retrieve_info_from_pte(str(program_path(tiny_v14_bundle, mode)))
    assert info == {"output_vocab_size": n_words(tiny_v14_bundle), "pte_max_context_len": 128,
                    "pte_max_seq_len": 128, "logits_scale": 1, "logits_zero_point": 0,
                    "kv_io_bit_width": 32}
    import sys

    assert not [m for m in sys.modules if m.startswith("executorch.backends.qualcomm")]


@pytest.mark.parametrize("mode", PROGRAMS)
def test_the_mask_is_4d_and_there_is_one_cache_per_layer(tiny_v14_bundle, mode):
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(program_path(tiny_v14_bundle, mode))
    cl, heads, hd, layers, vocab = 128, 2, 16, 2, n_words(tiny_v14_bundle)
    for method, ar in PROGRAMS[mode][1].items():
        meta = program.metadata(method)
        inputs = [tuple(meta.input_tensor_meta(i).sizes()) for i in range(meta.num_inputs())]
        outputs = [tuple(meta.output_tensor_meta(i).sizes()) for i in range(meta.num_outputs())]
        # SL:765-793: tokens, mask [1, 1, AR, CL], input_pos, k then v caches, one each per layer.
        assert inputs == [(1, ar), (1, 1, ar, cl), (1, ar),
                          *[(1, heads, hd, cl - ar)] * layers, *[(1, heads, cl - ar, hd)] * layers]
        # RUN:221 (vocab from output 0), RUN:233-236 (k_cache [1, n_heads, head_dim, AR]).
        assert outputs == [(1, ar, vocab), *[(1, heads, hd, ar)] * layers,
                           *[(1, heads, ar, hd)] * layers]


def test_the_manifest_lists_the_programs_and_names_the_layout(tiny_v14_bundle):
    b = bundle_mod.load(tiny_v14_bundle, verify=True)
    assert {m: (b.modes[m].pte, b.modes[m].eval_mode) for m in b.modes} == {
        "kv": ("kv_llama_qnn.pte", 0), "hybrid": ("hybrid_llama_qnn.pte", 1),
        "lookahead": ("lookahead_llama_qnn.pte", 2)}
    assert {f.name for f in b.files if f.role == "pte"} == {p for p, _ in PROGRAMS.values()}
    assert b.modes["hybrid"].ar_len == CFG.prefill_ar_len and b.runner_dialect == "host"
    assert b.model["io_layout"] == "v1.4"
    assert json.loads(Path(tiny_v14_bundle).read_text())["name"] == "reference-tiny-v14"


def test_the_v1_0_1_bundle_stays_as_it_is(tiny_v14_bundle):
    from executorch.runtime import Runtime

    v10 = export_v10("tiny")
    assert v10.parent == v10_bundle_dir("tiny") != v14_bundle_dir("tiny") == tiny_v14_bundle.parent
    program = Runtime.get().load_program(program_path(v10, "kv"))
    assert "forward" in program.method_names and "kv_forward" not in program.method_names
    assert len(program.metadata("forward").input_tensor_meta(1).sizes()) == 3
    assert "io_layout" not in bundle_mod.load(v10).model


def test_farm_export_takes_the_layout(tiny_v14_bundle):
    from click.testing import CliRunner

    from farm.cli.export import export

    result = CliRunner().invoke(export, ["--model", "tiny", "--layout", "v1.4"])
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1] == str(tiny_v14_bundle)
    bad = CliRunner().invoke(export, ["--model", "tiny", "--layout", "v2"])
    assert bad.exit_code == 2 and "v1.4" in bad.output
