"""Bad input is one line naming the file, field or flag (and the line, where the format has one),
exit code 2, never a traceback: manifests, config files, duration flags, undecodable prompts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from farm.bundle import manifest as bundle_mod
from farm.config import load_config
from farm.errors import UsageError
from tests.support.devices import make_qnn_bundle, write

BIN = Path(sys.executable).parent


def _farm(*args: str, **env: str):
    from farm.cli.main import main

    return CliRunner().invoke(main, list(args), env=env or None)


def _one_error_line(output: str) -> str:
    assert "Traceback" not in output, output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    return lines[0]


# -- manifests -----------------------------------------------------------------------------------


def _set_mode(field, value):
    return lambda raw: raw["modes"]["hybrid"].__setitem__(field, value)


def _set_file(field, value):
    return lambda raw: raw["files"][2].__setitem__(field, value)


MANIFEST_CASES = {
    "ar_len-string": (_set_mode("ar_len", "x"), ["modes.hybrid", "'ar_len'"]),
    "ar_len-zero": (_set_mode("ar_len", 0), ["modes.hybrid", "'ar_len'"]),
    "ar_len-float": (_set_mode("ar_len", 1.5), ["modes.hybrid", "'ar_len'"]),
    "model-not-a-dict": (lambda raw: raw.__setitem__("model", "notadict"), ["'model'"]),
    "name-not-a-string": (lambda raw: raw.__setitem__("name", ["x"]), ["'name'"]),
    "decoder-not-a-string": (lambda raw: raw.__setitem__("decoder_model_version", 3),
                             ["'decoder_model_version'"]),
    "size-string": (_set_file("size", "12"), ["files[2]", "'size'"]),
    "size-negative": (_set_file("size", -1), ["files[2]", "'size'"]),
    "size-nan": (_set_file("size", float("nan")), ["files[2]", "'size'"]),
    "role-list": (_set_file("role", ["pte"]), ["files[2]", "'role'"]),
    "path-number": (_set_file("path", 5), ["files[2]", "'path'"]),
    "path-nul": (_set_file("path", "a\0b"), ["files[2]", "'path'"]),
    "path-empty": (_set_file("path", ""), ["files[2]", "'path'"]),
    "files-not-a-list": (lambda raw: raw.__setitem__("files", "x"), ["'files'"]),
    "modes-a-list": (lambda raw: raw.__setitem__("modes", []), ["'modes'"]),
    "mode-not-an-object": (lambda raw: raw["modes"].__setitem__("kv", 1), ["modes.kv"]),
}


@pytest.mark.parametrize("case", sorted(MANIFEST_CASES))
def test_manifest_field_errors_name_file_and_field(tmp_path, case):
    edit, needles = MANIFEST_CASES[case]
    manifest = make_qnn_bundle(tmp_path / "b")
    raw = json.loads(manifest.read_text())
    edit(raw)
    manifest.write_text(json.dumps(raw))
    with pytest.raises(UsageError) as caught:
        bundle_mod.load(manifest)
    message = str(caught.value)
    assert str(manifest) in message and all(n in message for n in needles), message
    line = _one_error_line(_farm("bundle", "verify", str(manifest)).output)
    assert line.startswith("farm: error:") and needles[0] in line


@pytest.mark.parametrize("content,needle", [
    (b'{"format": "ptefarm-bundle/1", "name": "caf\xe9"}', "not valid UTF-8 (byte 0xe9"),
    (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
    (b'{"format": ', "not valid JSON"),
    (b"[]", "must be a JSON object"),
])
def test_unreadable_manifest_is_one_line(tmp_path, content, needle):
    manifest = write(tmp_path / "manifest.json", content)
    with pytest.raises(UsageError) as caught:
        bundle_mod.load(manifest)
    assert str(manifest) in str(caught.value) and needle in str(caught.value)
    result = _farm("bundle", "verify", str(manifest))
    assert result.exit_code == 2 and needle in _one_error_line(result.output)


def test_valid_manifest_still_loads(tmp_path):
    """The checks above refuse bad fields, not good ones (optional fields may be absent or null)."""
    manifest = make_qnn_bundle(tmp_path / "b")
    raw = json.loads(manifest.read_text())
    raw["model"] = None
    del raw["modes"]["kv"]["ar_len"]
    manifest.write_text(json.dumps(raw))
    b = bundle_mod.load(manifest, verify=True)
    assert b.model == {} and b.modes["kv"].ar_len == 1 and b.modes["hybrid"].ar_len == 32


# -- config --------------------------------------------------------------------------------------


def _config_error(tmp_path, text: str | bytes) -> str:
    path = tmp_path / "farm.toml"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    with pytest.raises(UsageError) as caught:
        load_config(path)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_non_utf8_config_is_one_line_with_its_line(tmp_path):
    message = _config_error(tmp_path, b'[pool]\nurl = "sqlite:///x"\n# caf\xe9\n')
    assert message.startswith(f"{tmp_path / 'farm.toml'}:3:") and "not valid UTF-8" in message
    result = _farm("pool", "--config", str(tmp_path / "farm.toml"), "status")
    assert result.exit_code == 2 and "not valid UTF-8" in _one_error_line(result.output)


NUMERIC_KEYS = [  # (table header, key, 1-based line of the key in the text below)
    ("[pool]", "lease_ttl_s", 4),
    ("[pool]", "acquire_timeout_s", 4),
    ("[pool]", "quarantine_after", 4),
    ("[run]", "command_timeout_s", 4),
    ("[run]", "help_timeout_s", 4),
    ("[[adb_servers]]", "port", 4),
]


@pytest.mark.parametrize("header,key,line", NUMERIC_KEYS)
@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "-5", "0", "-0.5"])
def test_every_numeric_key_must_be_finite_and_positive(tmp_path, header, key, line, value):
    text = f"# farm config\n\n{header}\n{key} = {value}\n"
    message = _config_error(tmp_path, text)
    section = "adb_servers[0]" if header.startswith("[[") else header.strip("[]")
    assert message.startswith(f"{tmp_path / 'farm.toml'}:{line}: key '{section}.{key}'"), message


def test_semantic_errors_give_the_line_of_the_key(tmp_path):
    text = ('[farm]\nhome = "/tmp/h"\n\n[[adb_servers]]\nhost = "a"\n\n[[adb_servers]]\nhost = "b"\n'
            'port = 70000\n\n[pool]\nurl = "sqlite:///x"\n')
    assert _config_error(tmp_path, text).startswith(f"{tmp_path / 'farm.toml'}:9: key 'adb_servers[1].port'")
    text = '[pool]\nurl = "sqlite:///x"\n\n[run]\n# where\nworkspace = "rel"\n'
    assert ":6: key 'run.workspace'" in _config_error(tmp_path, text)
    assert ":2: unknown key 'pool.ttl'" in _config_error(tmp_path, "[pool]\nttl = 1\n")
    assert ":1: key 'pool.lease_ttl_s'" in _config_error(tmp_path, "pool = {lease_ttl_s = nan}\n")
    assert ":3: key 'pool.quarantine_after' must be int" in _config_error(
        tmp_path, '[pool]\n\nquarantine_after = "3"\n')


def test_good_numbers_still_load(tmp_path):
    path = write(tmp_path / "farm.toml", "[pool]\nlease_ttl_s = 0.5\nquarantine_after = 1\n"
                                         "[run]\ncommand_timeout_s = 1e6\nhelp_timeout_s = 5\n")
    cfg = load_config(path)
    assert cfg.pool.lease_ttl_s == 0.5 and cfg.run.command_timeout_s == 1e6
    assert cfg.run.help_timeout_s == 5.0


# -- duration flags ------------------------------------------------------------------------------


@pytest.mark.parametrize("args,flag", [
    (["lease", "--ttl", "-5"], "--ttl"),
    (["lease", "--ttl", "inf"], "--ttl"),
    (["lease", "--ttl", "nan"], "--ttl"),
    (["lease", "--ttl", "0"], "--ttl"),
    (["lease", "--timeout", "-1"], "--timeout"),
    (["lease", "--timeout", "inf"], "--timeout"),
    (["lease", "--timeout", "nan"], "--timeout"),
    (["renew", "tok", "--ttl", "-inf"], "--ttl"),
    (["renew", "tok", "--ttl", "nan"], "--ttl"),
])
@pytest.mark.timeout(120)  # a regression would wait forever for a device (--timeout inf)
def test_pool_duration_flags_must_be_finite_and_positive(tmp_path, args, flag):
    url = f"sqlite:///{tmp_path / 'pool.db'}"
    result = _farm("pool", "--url", url, *args, PTEFARM_HOME=str(tmp_path / "home"))
    assert result.exit_code == 2, result.output
    line = _one_error_line(result.output)
    assert line.startswith(f"farm: error: {flag}:") and "finite" in line, line
    assert not (tmp_path / "pool.db").exists()  # refused before the pool was touched


@pytest.mark.parametrize("value", ["-1", "inf", "nan", "0"])
def test_run_timeout_must_be_finite_and_positive(tmp_path, value):
    manifest = make_qnn_bundle(tmp_path / "b")
    result = _farm("run", str(manifest), "--serial", "NOPE", "--prompt", "x", "--timeout", value)
    assert result.exit_code == 2
    assert _one_error_line(result.output).startswith("farm: error: --timeout:")


# -- undecodable prompts ---------------------------------------------------------------------------


def _env() -> dict[str, str]:
    return {**os.environ, "LC_ALL": "C.UTF-8", "PYTHONUTF8": "1"}


@pytest.mark.parametrize("flag", ["--prompt", "--system-prompt"])
def test_farm_run_prompt_with_an_invalid_byte(tmp_path, flag):
    manifest = make_qnn_bundle(tmp_path / "b")
    argv = [str(BIN / "farm").encode(), b"run", str(manifest).encode(), b"--serial", b"NOPE"]
    argv += [b"--prompt", b"ok"] if flag != "--prompt" else []
    argv += [flag.encode(), b"caf\xe9 \xff"]
    proc = subprocess.run(argv, capture_output=True, env=_env(), timeout=120)
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2, err
    line = _one_error_line(err)
    assert line.startswith(f"farm: error: {flag}: not valid UTF-8 (byte 0xe9"), line


@pytest.mark.parametrize("flag", ["prompt", "system_prompt"])
def test_host_runner_prompt_with_an_invalid_byte(tmp_path, flag):
    argv = [str(BIN / "farm-llama-runner").encode(), b"--model_path", b"missing.pte",
            f"--{flag}".encode(), b"\x80abc"]
    proc = subprocess.run(argv, capture_output=True, env=_env(), cwd=tmp_path, timeout=120)
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2, err
    line = _one_error_line(err)
    assert line == f"farm-llama-runner: error: --{flag}: not valid UTF-8 (byte 0x80 at character 0)"
    assert not (tmp_path / "outputs.txt").exists()
