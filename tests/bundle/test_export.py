"""farm export: a bundle with its three programs, a tokenizer and a manifest; cached by content."""

from __future__ import annotations

import json
import subprocess
import sys

from click.testing import CliRunner

from farm.bundle import manifest as bundle_mod
from farm.cli.main import main as farm_main


def test_manifest_describes_every_file(tiny_bundle):
    b = bundle_mod.load(tiny_bundle, verify=True)  # sizes and sha256 checked against the files
    assert b.runner_dialect == "host"
    assert set(b.modes) == {"kv", "hybrid", "lookahead"}
    assert b.modes["kv"].eval_mode == 0 and b.modes["hybrid"].eval_mode == 1
    assert b.modes["hybrid"].ar_len == b.model["prefill_ar_len"]
    lookahead = b.modes["lookahead"]
    assert (lookahead.eval_mode, lookahead.ar_len) == (2, b.model["prefill_ar_len"])
    assert lookahead.lookahead_args == ["--ngram", "3", "--window", "4", "--gcap", "4"]
    assert {f.role for f in b.files} == {"pte", "tokenizer"}


def test_programs_have_the_upstream_methods(tiny_bundle):
    from executorch.runtime import Runtime

    b = bundle_mod.load(tiny_bundle)
    by_name = {f.name: f.path for f in b.files}
    kv = Runtime.get().load_program(by_name[b.modes["kv"].pte])
    hybrid = Runtime.get().load_program(by_name[b.modes["hybrid"].pte])
    assert "forward" in kv.method_names
    assert {"prefill_forward", "kv_forward"} <= set(hybrid.method_names)
    # Upstream's lookahead export: a kv_forward holding (window + gcap) * (ngram - 1) rows.
    lookahead = Runtime.get().load_program(by_name[b.modes["lookahead"].pte])
    lhd = lookahead.load_method("kv_forward").metadata
    assert tuple(lhd.input_tensor_meta(0).sizes())[-1] == b.modes["lookahead"].decode_ar_len == 16
    m = b.model
    n_caches = m["n_layers"] * m["n_kv_heads"]
    meta = hybrid.load_method("prefill_forward").metadata
    assert meta.num_inputs() == 3 + 2 * n_caches
    assert meta.num_outputs() == 1 + 2 * n_caches
    cache_len = m["max_seq_len"] - m["prefill_ar_len"]
    assert tuple(meta.input_tensor_meta(3).sizes()) == (1, m["head_dim"], cache_len)  # K transposed
    assert tuple(meta.input_tensor_meta(3 + n_caches).sizes()) == (1, cache_len, m["head_dim"])
    assert tuple(meta.output_tensor_meta(0).sizes()) == (1, m["prefill_ar_len"], m["vocab_size"])


def test_tokenizer_is_read_by_pytorch_tokenizers(tiny_bundle):
    from farm.model.tokenizer import load_tokenizer

    b = bundle_mod.load(tiny_bundle)
    tok = load_tokenizer({f.name: f.path for f in b.files}[b.tokenizer])
    text = "Once upon a time, 'naïve' $(x)"
    assert tok.decode(tok.encode(text, bos=False, eos=False)) == text
    assert tok.n_words == b.model["vocab_size"]


# In a fresh interpreter (this one may have imported torch for other tests): `farm export` prints the
# cached bundle's manifest without importing torch, which no export can do without.
_EXPORT_IN_FRESH_PROCESS = (
    "import sys\n"
    "from farm.cli.main import main\n"
    "try:\n"
    "    main(['export', '--model', 'tiny'])\n"
    "except SystemExit as e:\n"
    "    code = e.code\n"
    "print('torch imported:', 'torch' in sys.modules, file=sys.stderr)\n"
    "sys.exit(code)\n")


def test_second_export_is_a_cache_hit(tiny_bundle):
    manifest_mtime = tiny_bundle.stat().st_mtime_ns
    proc = subprocess.run([sys.executable, "-c", _EXPORT_IN_FRESH_PROCESS],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == str(tiny_bundle)
    assert "torch imported: False" in proc.stderr, proc.stderr
    assert tiny_bundle.stat().st_mtime_ns == manifest_mtime  # found, not written again
    proc = subprocess.run([sys.executable, "-c",
                           "import sys; from farm.bundle.export import export_bundle; "
                           "export_bundle('tiny'); print('torch' in sys.modules)"],
                          capture_output=True, text=True, timeout=300)
    assert proc.stdout.strip() == "False", proc.stderr


def test_export_bad_model_names_the_flag():
    result = CliRunner().invoke(farm_main, ["export", "--model", "huge"])
    assert result.exit_code == 2
    assert "--model" in result.output and "huge" in result.output


def test_several_models_are_exported_by_one_call_one_manifest_each_in_order(tiny_bundle, qwen_bundle):
    result = CliRunner().invoke(farm_main, ["export", "--model", "tiny-qwen2_5", "--model", "tiny"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines() == [str(qwen_bundle), str(tiny_bundle)]


def test_an_unknown_model_among_several_fails_before_any_export(tmp_path, monkeypatch):
    from farm.bundle import export as v10

    exported = []
    monkeypatch.setattr(v10, "export_bundle", lambda name, *a, **k: exported.append(name))
    result = CliRunner().invoke(farm_main, ["export", "--out", str(tmp_path), "--model", "tiny",
                                            "--model", "huge"])
    assert result.exit_code == 2 and "unknown reference model 'huge'" in result.output
    assert exported == [] and not any(tmp_path.iterdir())


def test_export_config_is_a_deprecated_alias_of_model(tiny_bundle):
    result = CliRunner().invoke(farm_main, ["export", "--config", "tiny"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1] == str(tiny_bundle)
    assert "--config tiny is deprecated, use --model tiny" in result.stderr
    assert "--config" not in CliRunner().invoke(farm_main, ["export", "--help"]).output  # hidden
    bad = CliRunner().invoke(farm_main, ["export", "--config", "huge"])
    assert bad.exit_code == 2 and "--config: unknown reference model 'huge'" in bad.output
    clash = CliRunner().invoke(farm_main, ["export", "--config", "tiny", "--model", "small"])
    assert clash.exit_code == 2 and "disagree" in clash.output


def test_manifest_rejects_traversal_names(tmp_path, tiny_bundle):
    raw = json.loads(tiny_bundle.read_text())
    for entry in raw["files"]:
        entry["path"] = str(tiny_bundle.parent / entry["path"])
    raw["files"][0]["name"] = "../evil.pte"
    bad = tmp_path / "manifest.json"
    bad.write_text(json.dumps(raw))
    import pytest

    from farm.errors import UsageError

    with pytest.raises(UsageError, match=r"files\[0\].*escapes the workspace"):
        bundle_mod.load(bad)


def test_export_to_an_unusable_directory_names_it(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = CliRunner().invoke(farm_main, ["export", "--out", str(blocker / "bundles")])
    assert result.exit_code == 2
    assert "--out" in result.output and str(blocker) in result.output
    assert "Traceback" not in result.output
