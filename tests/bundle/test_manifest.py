"""The manifest contract: what a valid manifest loads to, and the one-line error every bad one gives.

A manifest decides what the farm reads on the host and pushes to a phone, so each refusal is pinned as
the whole message a user sees (the manifest, the field, the offending value), and each default as the
value a bundle gets without the field. Escapes from the bundle and corrupt files: test_integrity.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest

from farm.bundle import manifest as bundle_mod
from farm.bundle.manifest import (
    Bundle,
    BundleFile,
    Mode,
    check_workspace_name,
    describe_file,
    file_digest,
    load,
    sha256_file,
    verify_bundle,
)
from farm.errors import UsageError
from tests.support.devices import make_qnn_bundle, write

# make_qnn_bundle's files, in manifest order
KV, HYBRID, TOKENIZER, RUNNER, BACKEND = range(5)
ROLES = "('pte', 'tokenizer', 'runner', 'backend_lib', 'qnn_lib', 'other')"
DIALECTS = "host, qnn-v1.0, qnn-v1.4, auto"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _raw(manifest: Path) -> dict:
    return json.loads(manifest.read_text())


def _save(manifest: Path, raw) -> Path:
    manifest.write_text(json.dumps(raw))
    return manifest


def _edited(tmp_path: Path, edit) -> Path:
    manifest = make_qnn_bundle(tmp_path / "b")
    raw = _raw(manifest)
    edit(raw)
    return _save(manifest, raw)


def _refusal(manifest: Path) -> str:
    """The message of load's refusal, with the manifest's own path (always its first word) as ``M``."""
    with pytest.raises(UsageError) as caught:
        load(manifest)
    message = str(caught.value)
    assert message.startswith(f"{manifest}: "), message
    return "M" + message.removeprefix(str(manifest))


def _file(index: int, **fields):
    return lambda raw: raw["files"][index].update(fields)


def _drop_file_field(index: int, key: str):
    return lambda raw: raw["files"][index].pop(key)


def _mode(key: str, **fields):
    return lambda raw: raw["modes"][key].update(fields)


def _top(**fields):
    return lambda raw: raw.update(fields)


def _drop(key: str):
    return lambda raw: raw.pop(key)


# -- field errors: (edit, the whole message) ---------------------------------------------------------

FIELD_ERRORS = {
    # the manifest as a whole
    "format-missing": (_drop("format"), "M: field 'format' is None, expected 'ptefarm-bundle/1'"),
    "format-other": (_top(format="ptefarm-bundle/2"),
                     "M: field 'format' is 'ptefarm-bundle/2', expected 'ptefarm-bundle/1'"),
    "dialect-unknown": (_top(runner_dialect="qnn-v2"),
                        f"M: field 'runner_dialect' is 'qnn-v2', expected one of {DIALECTS}"),
    "dialect-not-a-string": (_top(runner_dialect=7), "M: field 'runner_dialect' has the wrong type (int)"),
    "dialect-and-runner-missing": (lambda raw: [raw.pop("runner_dialect"), raw.pop("runner")],
                                   "M: missing field 'runner_dialect'"),
    "dialect-null-without-runner": (_top(runner_dialect=None, runner=None),
                                    "M: field 'runner_dialect' has the wrong type (NoneType)"),
    "name-not-a-string": (_top(name=["x"]), "M: field 'name' has the wrong type (list)"),
    "decoder-not-a-string": (_top(decoder_model_version=3),
                             "M: field 'decoder_model_version' has the wrong type (int)"),
    "model-not-an-object": (_top(model="x"), "M: field 'model' has the wrong type (str)"),
    "files-missing": (_drop("files"), "M: missing field 'files'"),
    "files-an-object": (_top(files={}), "M: field 'files' has the wrong type (dict)"),
    "modes-missing": (_drop("modes"), "M: missing field 'modes'"),
    "modes-a-list": (_top(modes=[]), "M: field 'modes' has the wrong type (list)"),
    "modes-empty": (_top(modes={}), "M: field 'modes' is empty"),
    "tokenizer-missing": (_drop("tokenizer"), "M: missing field 'tokenizer'"),
    "tokenizer-not-a-string": (_top(tokenizer=1), "M: field 'tokenizer' has the wrong type (int)"),
    "tokenizer-not-a-file": (_top(tokenizer="tok.model"),
                             "M: tokenizer 'tok.model' is not among the manifest's files"),
    "runner-for-host": (_top(runner_dialect="host"),
                        "M: field 'runner' must be absent for the host runner dialect"),
    "runner-missing-for-qnn": (_top(runner=None),
                               "M: field 'runner' must name one of the manifest's files for dialect "
                               "'qnn-v1.0'"),
    "runner-not-a-file": (_top(runner="other_runner"),
                          "M: field 'runner' must name one of the manifest's files for dialect "
                          "'qnn-v1.0'"),
    "runner-not-a-string": (_top(runner=["qnn_llama_runner"], runner_dialect="auto"),
                            "M: field 'runner' must name one of the manifest's files for dialect 'auto'"),
    # files[i]
    "file-not-an-object": (lambda raw: raw["files"].insert(0, "kv.pte"), "M: files[0]: must be an object, got str"),
    "file-name-missing": (_drop_file_field(KV, "name"),
                          "M: files[0]: file name must be a non-empty string, got None"),
    "file-path-number": (_file(TOKENIZER, path=5),
                         "M: files[2]: field 'path' must be a non-empty string, got 5"),
    "file-path-empty": (_file(TOKENIZER, path=""),
                        "M: files[2]: field 'path' must be a non-empty string, got ''"),
    "file-path-nul": (_file(TOKENIZER, path="a\0b"),
                      "M: files[2]: field 'path' 'a\\x00b' contains a NUL byte"),
    "file-size-missing": (_drop_file_field(KV, "size"), "M: files[0]: missing field 'size'"),
    "file-size-string": (_file(KV, size="12"), "M: files[0]: field 'size' has the wrong type (str)"),
    "file-size-bool": (_file(KV, size=True), "M: files[0]: field 'size' has the wrong type (bool)"),
    "file-size-float": (_file(KV, size=4096.0), "M: files[0]: field 'size' has the wrong type (float)"),
    "file-size-negative": (_file(KV, size=-1), "M: files[0]: field 'size' is negative (-1)"),
    "file-size-wrong": (_file(TOKENIZER, size=4), "M: files[2]: {b}/tokenizer.model is 3 bytes, "
                                                   "manifest says 4"),
    "file-sha256-missing": (_drop_file_field(KV, "sha256"), "M: files[0]: missing field 'sha256'"),
    "file-sha256-short": (_file(KV, sha256="ab" * 31 + "a"),
                          "M: files[0]: field 'sha256' is not a lowercase hex sha256"),
    "file-sha256-long": (_file(KV, sha256="ab" * 32 + "a"),
                         "M: files[0]: field 'sha256' is not a lowercase hex sha256"),
    "file-sha256-upper": (_file(KV, sha256="AB" * 32),
                          "M: files[0]: field 'sha256' is not a lowercase hex sha256"),
    "file-sha256-placeholder": (_file(KV, sha256="X" * 64),
                                "M: files[0]: field 'sha256' is not a lowercase hex sha256"),
    "file-sha256-not-hex": (_file(KV, sha256="g" + "a" * 63),
                            "M: files[0]: field 'sha256' is not a lowercase hex sha256"),
    "file-role-unknown": (_file(KV, role="model"),
                          f"M: files[0]: field 'role' is 'model', expected one of {ROLES}"),
    "file-role-not-a-string": (_file(KV, role=["pte"]),
                               "M: files[0]: field 'role' has the wrong type (list)"),
    "file-htp-arch-number": (_file(KV, htp_arch=75),
                             "M: files[0]: field 'htp_arch' is 75, expected like 'v75'"),
    "file-htp-arch-no-v": (_file(KV, htp_arch="75"),
                           "M: files[0]: field 'htp_arch' is '75', expected like 'v75'"),
    "file-duplicate-name": (_file(HYBRID, name="kv.pte"), "M: files[1]: duplicate file name 'kv.pte'"),
    "file-duplicate-after-normalising": (_file(HYBRID, name="./kv.pte"),
                                         "M: files[1]: duplicate file name 'kv.pte'"),
    "file-missing": (_file(TOKENIZER, path="gone.model"),
                     "M: files[2]: file {b}/gone.model does not exist"),
    "file-a-directory": (_file(TOKENIZER, path="v75"), "M: files[2]: {b}/v75 is a directory, not a file"),
    "file-the-bundle-directory": (_file(TOKENIZER, path="."),
                                  "M: files[2]: {b} is a directory, not a file"),
    # modes.<key>
    "mode-not-an-object": (_top(modes={"kv": 1}), "M: modes.kv: must be an object, got int"),
    "mode-pte-missing": (lambda raw: raw["modes"]["kv"].pop("pte"), "M: modes.kv: missing field 'pte'"),
    "mode-pte-not-a-file": (_mode("kv", pte="kv2.pte"),
                            "M: modes.kv: pte 'kv2.pte' is not among the manifest's files"),
    "mode-eval-mode-missing": (lambda raw: raw["modes"]["kv"].pop("eval_mode"),
                               "M: modes.kv: missing field 'eval_mode'"),
    "mode-eval-mode-unknown": (_mode("kv", eval_mode=3),
                               "M: modes.kv: field 'eval_mode' is 3, expected 0, 1, 2"),
    "mode-eval-mode-negative": (_mode("kv", eval_mode=-1),
                                "M: modes.kv: field 'eval_mode' is -1, expected 0, 1, 2"),
    "mode-eval-mode-bool": (_mode("kv", eval_mode=False),
                            "M: modes.kv: field 'eval_mode' has the wrong type (bool)"),
    "mode-ar-len-zero": (_mode("hybrid", ar_len=0),
                         "M: modes.hybrid: field 'ar_len' must be positive, got 0"),
    "mode-ar-len-string": (_mode("hybrid", ar_len="32"),
                           "M: modes.hybrid: field 'ar_len' has the wrong type (str)"),
}


@pytest.mark.parametrize("case", sorted(FIELD_ERRORS))
def test_a_bad_field_is_refused_in_one_message_naming_manifest_field_and_value(tmp_path, case):
    edit, expected = FIELD_ERRORS[case]
    manifest = _edited(tmp_path, edit)
    assert _refusal(manifest) == expected.format(b=manifest.parent.resolve())


@pytest.mark.parametrize("content,expected", [
    (b"[]", "M: manifest must be a JSON object"),
    (b'"ptefarm-bundle/1"', "M: manifest must be a JSON object"),
    (b'{"format": ', "M: not valid JSON: Expecting value: line 1 column 12 (char 11)"),
    (b"[" * 100_000 + b"]" * 100_000, "M: not valid JSON: nested too deeply"),
    (b'{"name": "ok", "x": "caf\xe9"}', "M: manifest is not valid UTF-8 (byte 0xe9 at offset 24)"),
    (b'\x80{}', "M: manifest is not valid UTF-8 (byte 0x80 at offset 0)"),
])
def test_an_unreadable_manifest_is_refused_saying_why(tmp_path, content, expected):
    manifest = write(tmp_path / "manifest.json", content)
    assert _refusal(manifest) == expected


def test_a_bundle_file_that_is_not_a_regular_file_is_refused_saying_what_it_is(tmp_path):
    manifest = make_qnn_bundle(tmp_path / "b")
    os.mkfifo(manifest.parent / "pipe")
    raw = _raw(manifest)
    raw["files"][TOKENIZER]["path"] = "pipe"
    assert _refusal(_save(manifest, raw)) == f"M: files[2]: {manifest.parent.resolve()}/pipe is not a " \
                                             f"regular file"


def test_a_missing_or_unreadable_manifest_is_refused_naming_it(tmp_path):
    assert _refusal(tmp_path / "nope.json") == "M: manifest not found"
    (tmp_path / "dir.json").mkdir()
    assert _refusal(tmp_path / "dir.json") == "M: cannot read manifest: Is a directory"


# -- file names in the workspace -----------------------------------------------------------------


@pytest.mark.parametrize("name,problem", [
    (None, "file name must be a non-empty string, got None"),
    ("", "file name must be a non-empty string, got ''"),
    (7, "file name must be a non-empty string, got 7"),
    ("a\0b", "file name 'a\\x00b' contains a NUL or newline"),
    ("a\nb", "file name 'a\\nb' contains a NUL or newline"),
    ("/data/local/tmp/x", "file name '/data/local/tmp/x' is absolute; it must stay inside the workspace"),
    ("..", "file name '..' escapes the workspace ('..')"),
    ("../x.pte", "file name '../x.pte' escapes the workspace ('..')"),
    ("lib/../../x.pte", "file name 'lib/../../x.pte' escapes the workspace ('..')"),
    ("lib/../x.pte", "file name 'lib/../x.pte' escapes the workspace ('..')"),
    (".", "file name '.' names the workspace itself"),
    ("./", "file name './' names the workspace itself"),
    ("./.", "file name './.' names the workspace itself"),
])
def test_a_workspace_name_that_is_not_a_plain_relative_name_is_refused(name, problem):
    with pytest.raises(UsageError) as caught:
        check_workspace_name(name, "m.json: files[3]")
    assert str(caught.value) == f"m.json: files[3]: {problem}"


@pytest.mark.parametrize("name,normal", [
    ("kv.pte", "kv.pte"),
    ("./kv.pte", "kv.pte"),
    ("lib//libQnnHtp.so", "lib/libQnnHtp.so"),
    ("lib/./libQnnHtp.so", "lib/libQnnHtp.so"),
    ("..hidden", "..hidden"),  # a name that starts with two dots is not '..'
    ("v..75/x", "v..75/x"),
])
def test_a_plain_workspace_name_is_accepted_in_normal_form(name, normal):
    assert check_workspace_name(name, "m.json: files[0]") == normal


def test_a_name_with_two_leading_dots_loads(tmp_path):
    manifest = make_qnn_bundle(tmp_path / "b")
    raw = _raw(manifest)
    raw["files"][TOKENIZER].update(name="..tok", path="tokenizer.model")
    raw["tokenizer"] = "..tok"
    b = load(_save(manifest, raw), verify=True)
    assert b.tokenizer == "..tok" and b.files[TOKENIZER].name == "..tok"


# -- what a valid manifest loads to ----------------------------------------------------------------


def test_a_manifest_loads_to_the_bundle_it_describes(tmp_path):
    manifest = make_qnn_bundle(tmp_path / "b", name="qnn-1", archs=("v75",))
    raw = _raw(manifest)
    raw["model"] = {"max_seq_len": 128, "note": "free-form"}
    raw["decoder_model_version"] = "qwen2_5"
    raw["runner_dialect"] = "qnn-v1.4"
    b = load(_save(manifest, raw), verify=True)
    base = manifest.parent.resolve()
    assert (b.name, b.runner_dialect, b.tokenizer, b.runner, b.decoder_model_version) == (
        "qnn-1", "qnn-v1.4", "tokenizer.model", "qnn_llama_runner", "qwen2_5")
    assert b.model == {"max_seq_len": 128, "note": "free-form"}
    assert b.modes == {"kv": Mode("kv.pte", 0, 1), "hybrid": Mode("hybrid.pte", 1, 32)}
    assert b.manifest_path == manifest.resolve()
    tok = b.files[TOKENIZER]
    assert tok == BundleFile(name="tokenizer.model", path=base / "tokenizer.model", size=3,
                             sha256=_sha(b"tok"), role="tokenizer", htp_arch=None)
    stub = next(f for f in b.files if f.name == "libQnnHtpV75Stub.so")
    assert (stub.path, stub.role, stub.htp_arch) == (base / "v75" / "libQnnHtpV75Stub.so", "qnn_lib", "v75")
    assert [f.name for f in b.files] == [e["name"] for e in raw["files"]]


def test_optional_fields_absent_or_null_take_their_defaults(tmp_path):
    manifest = make_qnn_bundle(tmp_path / "my-bundle")
    raw = _raw(manifest)
    for key in ("name", "decoder_model_version", "model"):
        raw.pop(key)
    raw["files"][KV].pop("role")
    raw["files"][HYBRID]["role"] = None
    raw["files"][TOKENIZER].pop("path")  # the path defaults to the name
    raw["files"][TOKENIZER].pop("htp_arch")
    raw["modes"]["kv"].pop("ar_len")
    raw["modes"]["hybrid"]["ar_len"] = None
    b = load(_save(manifest, raw), verify=True)
    assert (b.name, b.decoder_model_version, b.model) == ("my-bundle", "llama3", {})
    assert [f.role for f in b.files[:3]] == ["other", "other", "tokenizer"]
    assert b.files[TOKENIZER].path == manifest.parent.resolve() / "tokenizer.model"
    assert b.files[TOKENIZER].htp_arch is None
    assert b.modes["kv"].ar_len == 1 and b.modes["hybrid"].ar_len == 1
    raw.update(name=None, decoder_model_version=None, model=None)
    b = load(_save(manifest, raw))
    assert (b.name, b.decoder_model_version, b.model) == ("my-bundle", "llama3", {})


@pytest.mark.parametrize("dialect", ["host", "qnn-v1.0", "qnn-v1.4", "auto"])
def test_every_dialect_loads_as_written(tmp_path, dialect):
    manifest = make_qnn_bundle(tmp_path / "b")
    raw = _raw(manifest)
    raw["runner_dialect"] = dialect
    if dialect == "host":
        raw["runner"] = None
    b = load(_save(manifest, raw))
    assert b.runner_dialect == dialect
    assert b.runner == (None if dialect == "host" else "qnn_llama_runner")


def test_a_runner_without_a_dialect_asks_the_runner_and_no_runner_means_the_host_runner(tmp_path):
    manifest = make_qnn_bundle(tmp_path / "b")
    raw = _raw(manifest)
    raw.pop("runner_dialect")
    assert load(_save(manifest, raw)).runner_dialect == "auto"  # the QNN runner's --help tells
    raw["runner_dialect"] = None
    assert load(_save(manifest, raw)).runner_dialect == "auto"
    raw.update(runner_dialect="auto", runner=None)
    b = load(_save(manifest, raw))  # farm-llama-runner, asked the same way
    assert (b.runner_dialect, b.runner) == ("auto", None)


def test_boundary_values_that_are_valid_load(tmp_path):
    """An empty file, ar_len 1, every eval mode, and one name per HTP arch are all legal."""
    manifest = make_qnn_bundle(tmp_path / "b")
    write(manifest.parent / "empty.bin", b"")
    raw = _raw(manifest)
    raw["files"].append({"name": "empty.bin", "path": "empty.bin", "size": 0, "sha256": _sha(b""),
                         "role": "other", "htp_arch": None})
    raw["modes"]["hybrid"]["ar_len"] = 1
    raw["modes"]["lookahead"] = {"pte": "hybrid.pte", "eval_mode": 2, "ar_len": 8}
    b = load(_save(manifest, raw), verify=True)
    assert b.files[-1].size == 0 and b.modes["hybrid"].ar_len == 1
    assert b.modes["lookahead"] == Mode("hybrid.pte", 2, 8)
    assert [f.name for f in b.files].count("libQnnHtp.so") == 2  # v73 and v75: not duplicates


def test_load_with_verify_checks_the_content(tmp_path):
    manifest = make_qnn_bundle(tmp_path / "b")
    (manifest.parent / "tokenizer.model").write_text("TOK")  # same size, other bytes
    load(manifest)  # sizes only
    with pytest.raises(UsageError, match=_sha(b"TOK")):
        load(manifest, verify=True)


def test_a_written_manifest_loads_back_equal_with_paths_relative_to_it(tmp_path):
    root = tmp_path / "b"
    files = [describe_file(root, write(root / "kv.pte", "kv"), role="pte"),
             describe_file(root, write(root / "t" / "tok.bin", "tok"), role="tokenizer",
                           name="tokenizer.model"),
             describe_file(root, write(root / "v75" / "libQnnHtp.so", "htp"), role="qnn_lib",
                           htp_arch="v75")]
    bundle = Bundle(name="round-trip", runner_dialect="host", tokenizer="tokenizer.model", files=files,
                    modes={"kv": Mode("kv.pte", 0, 1)}, decoder_model_version="qwen3",
                    model={"max_seq_len": 64})
    manifest = root / "manifest.json"
    bundle.write(manifest)
    assert bundle.manifest_path == manifest
    raw = _raw(manifest)
    assert raw["format"] == "ptefarm-bundle/1" and raw["runner"] is None
    assert [f["path"] for f in raw["files"]] == ["kv.pte", "t/tok.bin", "v75/libQnnHtp.so"]
    assert raw["files"][1] == {"name": "tokenizer.model", "path": "t/tok.bin", "size": 3,
                               "sha256": _sha(b"tok"), "role": "tokenizer", "htp_arch": None}
    assert raw["modes"] == {"kv": {"pte": "kv.pte", "eval_mode": 0, "ar_len": 1}}
    assert manifest.read_text() == json.dumps(raw, indent=2) + "\n"  # reviewable, diffable text
    loaded = load(manifest, verify=True)
    assert loaded.files == [BundleFile(**{**vars(f), "path": f.path.resolve()}) for f in files]
    assert (loaded.name, loaded.runner_dialect, loaded.decoder_model_version, loaded.model, loaded.modes) \
        == ("round-trip", "host", "qwen3", {"max_seq_len": 64}, bundle.modes)


def test_describe_file_gives_size_digest_and_the_file_name_by_default(tmp_path):
    path = write(tmp_path / "sub" / "kv.pte", "twelve bytes")
    f = describe_file(tmp_path, tmp_path / "sub" / ".." / "sub" / "kv.pte", role="pte")
    assert f == BundleFile(name="kv.pte", path=path.resolve(), size=12, sha256=_sha(b"twelve bytes"),
                           role="pte", htp_arch=None)
    g = describe_file(tmp_path, path, role="qnn_lib", name="lib.so", htp_arch="v79")
    assert (g.name, g.role, g.htp_arch) == ("lib.so", "qnn_lib", "v79")


# -- a bundle's files per device and its context ------------------------------------------------------


def test_a_device_receives_the_common_files_and_the_qnn_libraries_of_its_arch(tmp_path):
    b = load(make_qnn_bundle(tmp_path / "b", archs=("v73", "v75")))
    common = ["kv.pte", "hybrid.pte", "tokenizer.model", "qnn_llama_runner", "libqnn_executorch_backend.so"]
    for arch in ("v73", "v75"):
        got = b.files_for(arch)
        assert [f.name for f in got] == [*common, "libQnnHtpV%sStub.so" % arch[1:], "libQnnHtp.so"]
        assert {f.htp_arch for f in got[5:]} == {arch}
    assert [f.name for f in b.files_for(None)] == common
    assert [f.name for f in b.files_for("v79")] == common
    assert b.htp_archs() == {"v73", "v75"}
    assert load(make_qnn_bundle(tmp_path / "c", archs=())).htp_archs() == set()


@pytest.mark.parametrize("model,context", [
    ({"max_seq_len": 128}, (128, "model.max_seq_len")),
    ({"max_context_len": 512}, (512, "model.max_context_len")),
    ({"context_len": 2048}, (2048, "model.context_len")),
    ({"max_seq_len": 128, "max_context_len": 512, "context_len": 9}, (128, "model.max_seq_len")),
    ({"max_context_len": 512, "context_len": 9}, (512, "model.max_context_len")),
    ({"max_seq_len": 2}, (2, "model.max_seq_len")),
    ({"max_seq_len": 1, "context_len": 64}, (64, "model.context_len")),  # 1 says nothing usable
    ({"max_seq_len": 0}, None),
    ({"max_seq_len": True}, None),
    ({"max_seq_len": "128"}, None),
    ({"max_seq_len": 128.0}, None),
    ({"seq_len": 128}, None),
    ({}, None),
])
def test_the_context_is_the_first_usable_length_the_model_gives(model, context):
    b = Bundle(name="b", runner_dialect="host", tokenizer="t", files=[], modes={}, model=model)
    assert b.context() == context


# -- file_digest and verify_bundle -----------------------------------------------------------------


def test_sha256_of_a_file_larger_than_one_read(tmp_path):
    data = os.urandom(3000)
    path = write(tmp_path / "f", data)
    assert sha256_file(path, chunk=1024) == sha256_file(path) == file_digest(path) == _sha(data)


class _Clock:
    """``time`` as file_digest sees it: now is a given age after the file's last change."""

    def __init__(self, monkeypatch):
        self.now_ns = 0
        monkeypatch.setattr(bundle_mod, "time", self)

    def time_ns(self) -> int:
        return self.now_ns

    def age(self, path: Path, seconds: float) -> None:
        st = os.stat(path)
        self.now_ns = max(st.st_mtime_ns, st.st_ctime_ns) + int(seconds * 1e9)


@pytest.fixture()
def hashed(monkeypatch) -> list[Path]:
    """Every file sha256_file reads from now on."""
    seen: list[Path] = []
    real = bundle_mod.sha256_file
    monkeypatch.setattr(bundle_mod, "sha256_file", lambda p, *a: seen.append(Path(p)) or real(p, *a))
    return seen


def test_an_unchanged_file_is_hashed_once_when_older_than_the_racy_window(tmp_path, monkeypatch, hashed):
    clock = _Clock(monkeypatch)
    old = write(tmp_path / "old", "old bytes")
    clock.age(old, 1.5)
    for _ in range(3):
        assert file_digest(old) == _sha(b"old bytes")
    assert hashed == [old]


@pytest.mark.parametrize("age_s", [0.0, 0.5, 1.0])  # 1.0: exactly the window is not past it
def test_a_file_changed_within_the_racy_window_is_hashed_every_time(tmp_path, monkeypatch, hashed, age_s):
    """File times are coarse: a rewrite within the same tick would not move them, so a file changed
    less than RACY_NS ago is never trusted from the cache."""
    assert bundle_mod.RACY_NS == 1_000_000_000
    clock = _Clock(monkeypatch)
    fresh = write(tmp_path / "fresh", "fresh")
    clock.age(fresh, age_s)
    for _ in range(2):
        assert file_digest(fresh) == _sha(b"fresh")
    assert hashed == [fresh, fresh]


def test_a_file_changed_while_hashed_is_not_cached(tmp_path, monkeypatch):
    clock = _Clock(monkeypatch)
    path = write(tmp_path / "f", "first")
    clock.age(path, 5)
    real = bundle_mod.sha256_file

    def hash_then_rewrite(p, *a):
        digest = real(p, *a)
        Path(p).write_text("later")  # after the read: the digest is of the old content
        return digest

    monkeypatch.setattr(bundle_mod, "sha256_file", hash_then_rewrite)
    assert file_digest(path) == _sha(b"first")
    monkeypatch.setattr(bundle_mod, "sha256_file", real)
    clock.age(path, 5)
    assert file_digest(path) == _sha(b"later")


def _bundle(tmp_path: Path) -> tuple[Path, Bundle]:
    manifest = make_qnn_bundle(tmp_path / "b")
    return manifest, load(manifest, verify=True)


def _verify_refusal(bundle: Bundle, index: int) -> str:
    with pytest.raises(UsageError) as caught:
        verify_bundle(bundle)
    prefix = f"{bundle.manifest_path}: files[{index}] ({bundle.files[index].name}): "
    message = str(caught.value)
    assert message.startswith(prefix), message
    return message.removeprefix(prefix)


def test_verify_refuses_a_file_that_is_gone_a_directory_or_not_regular(tmp_path):
    manifest, b = _bundle(tmp_path)
    tok = manifest.parent.resolve() / "tokenizer.model"
    tok.unlink()
    assert _verify_refusal(b, TOKENIZER) == f"cannot read {tok}: No such file or directory"
    tok.mkdir()
    assert _verify_refusal(b, TOKENIZER) == f"{tok} is a directory, not a file"
    tok.rmdir()
    os.mkfifo(tok)
    assert _verify_refusal(b, TOKENIZER) == f"{tok} is not a regular file"


def test_a_symlink_loop_is_refused_naming_the_file(tmp_path):
    manifest, b = _bundle(tmp_path)
    tok = manifest.parent.resolve() / "tokenizer.model"
    tok.unlink()
    tok.symlink_to(tok)
    assert _verify_refusal(b, TOKENIZER) == f"cannot read {tok}: Symlink loop from '{tok}'"
    assert _refusal(manifest) == f"M: files[2]: field 'path' 'tokenizer.model' cannot be resolved: " \
                                 f"Symlink loop from '{tok}'"


def test_verify_refuses_a_changed_size_or_content_naming_both_values(tmp_path):
    manifest, b = _bundle(tmp_path)
    tok = manifest.parent.resolve() / "tokenizer.model"
    tok.write_text("toke")
    assert _verify_refusal(b, TOKENIZER) == f"{tok} is 4 bytes, manifest says 3 (truncated or replaced)"
    tok.write_text("TOK")
    assert _verify_refusal(b, TOKENIZER) == (f"{tok} has sha256 {_sha(b'TOK')}, manifest says "
                                             f"{_sha(b'tok')} (corrupted or changed)")
    tok.write_text("tok")
    verify_bundle(b)


def test_verify_refuses_an_unreadable_file_naming_it(tmp_path, monkeypatch):
    manifest, b = _bundle(tmp_path)

    def unreadable(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(bundle_mod, "file_digest", unreadable)  # root reads any file: simulated
    kv = manifest.parent.resolve() / "kv.pte"
    assert _verify_refusal(b, KV) == f"cannot read {kv}: Permission denied"


def test_verify_of_a_bundle_built_in_memory_names_the_bundle(tmp_path):
    path = write(tmp_path / "kv.pte", "kv")
    b = Bundle(name="in-memory", runner_dialect="host", tokenizer="kv.pte", modes={},
               files=[describe_file(tmp_path, path, role="pte")])
    verify_bundle(b)  # no manifest: no directory to stay inside, the rest is checked
    path.write_text("KV")
    with pytest.raises(UsageError) as caught:
        verify_bundle(b)
    assert str(caught.value).startswith("in-memory: files[0] (kv.pte): ")


def test_a_lookahead_mode_carries_the_flags_its_program_was_exported_for(tmp_path):
    manifest = make_qnn_bundle(tmp_path / "b")
    raw = _raw(manifest)
    raw["modes"]["lookahead"] = {"pte": "hybrid.pte", "eval_mode": 2, "ar_len": 8, "ngram": 3,
                                 "window": 8, "gcap": 8}
    b = load(_save(manifest, raw))
    mode = b.modes["lookahead"]
    assert mode.lookahead_args == ["--ngram", "3", "--window", "8", "--gcap", "8"]
    assert mode.decode_ar_len == 32  # llama.py: next_power_of_two((8 + 8) * (3 - 1))
    assert b.modes["hybrid"].lookahead_args == [] and b.modes["hybrid"].decode_ar_len == 1
    b.write(manifest)  # written back as given, and other modes without the keys
    written = json.loads(manifest.read_text())["modes"]
    assert written["lookahead"]["gcap"] == 8 and "ngram" not in written["hybrid"]


def test_lookahead_flags_of_one_are_the_smallest_allowed(tmp_path):
    manifest = make_qnn_bundle(tmp_path / "b")
    raw = _raw(manifest)
    raw["modes"]["lookahead"] = {"pte": "hybrid.pte", "eval_mode": 2, "ar_len": 8, "ngram": 2,
                                 "window": 1, "gcap": 1}
    assert load(_save(manifest, raw)).modes["lookahead"].lookahead_args == [
        "--ngram", "2", "--window", "1", "--gcap", "1"]


@pytest.mark.parametrize("mode, message", [
    ({"eval_mode": 2, "ngram": 3, "window": 4}, "modes.lookahead: field 'gcap' must be a positive "
                                                "integer beside 'ngram', 'window'"),
    ({"eval_mode": 2, "ngram": 0, "window": 4, "gcap": 4}, "field 'ngram' must be a positive integer"),
    ({"eval_mode": 1, "ngram": 3, "window": 4, "gcap": 4}, "modes.lookahead: field 'ngram' is for "
                                                           "lookahead decoding (eval_mode 2), not "
                                                           "eval_mode 1"),
    ({"eval_mode": 2, "ngram": "3", "window": 4, "gcap": 4}, "modes.lookahead: field 'ngram' has the wrong type (str)"),
], ids=["one missing", "zero", "not a lookahead mode", "not a number"])
def test_lookahead_flags_that_cannot_be_right_are_refused_naming_the_field(tmp_path, mode, message):
    manifest = make_qnn_bundle(tmp_path / "b")
    raw = _raw(manifest)
    raw["modes"]["lookahead"] = {"pte": "hybrid.pte", "ar_len": 8, **mode}
    with pytest.raises(UsageError, match=re.escape(message)):
        load(_save(manifest, raw))
