"""Integrity end to end: no escape from the bundle, no false pass from a corrupt file or an empty run.

- a manifest path outside its directory (``..``, absolute, a symlink) is refused at load time;
- ``verify_bundle`` refuses a file corrupted in place (naming both digests) or truncated, and does not
  re-hash unchanged files;
- deploy records the digest of the bytes it pushed, refuses a host file that does not match the manifest,
  and a restored file is then pushed; temp files never survive under any name;
- a runner that exits 0 without outputs is ``RunIncomplete``; a crash carries the stderr tail;
- two empty outputs never agree.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from farm.bundle import manifest as bundle_mod
from farm.bundle.manifest import describe_file, verify_bundle
from farm.device.discovery import find_device
from farm.errors import AdbError, InfraError, RunIncomplete, UsageError
from farm.execute.compare import UPDATER_PAIR, Comparison
from farm.execute.deploy import PARTIAL_SUFFIX, RECORD_NAME, bundle_workspace, deploy
from farm.execute.run import RunnerFailed, RunResult, check_complete, run
from farm.execute.runprofile import RunnerCommand, RunRequest
from farm.virtual import VirtualDeviceSpec, VirtualFarm
from tests.support.devices import make_qnn_bundle, wait_for_sync_sessions_to_end, write
from tests.support.virtual import CHUNKED_FROM_BYTES

# Every deploy here runs with whole-file pushes and again with chunked deploy on.
pytestmark = pytest.mark.usefixtures("deploy_mode")



def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _farm(*args: str):
    from farm.cli.main import main

    return CliRunner().invoke(main, list(args))


def _edit_manifest(manifest: Path, edit) -> None:
    raw = json.loads(manifest.read_text())
    edit(raw)
    manifest.write_text(json.dumps(raw))


def _corrupt_in_place(path: Path) -> bytes:
    """Flip one byte, same size; returns the original content."""
    original = path.read_bytes()
    path.write_bytes(original[:-1] + bytes([original[-1] ^ 0xFF]))
    assert path.stat().st_size == len(original)
    return original


# -- escape from the bundle ---------------------------------------------------------------------


def _point_tokenizer_at(manifest: Path, target: Path, rel: str) -> None:
    data = target.read_bytes()

    def edit(raw):
        entry = next(f for f in raw["files"] if f["name"] == "tokenizer.model")
        entry.update(path=rel, size=len(data), sha256=_sha(data))

    _edit_manifest(manifest, edit)


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink", "symlinked-dir", "sibling-prefix",
                                 "symlink-to-sibling-prefix"])
def test_path_outside_the_manifest_directory_is_refused(tmp_path, how):
    manifest = make_qnn_bundle(tmp_path / "bundles" / "b")
    # A sibling whose name starts with the bundle directory's (bundles/b-evil beside bundles/b) is
    # outside it as much as any other directory: containment is by path components, not by prefix.
    outside = tmp_path / "bundles" / "b-evil" if "sibling-prefix" in how else tmp_path / "outside"
    secret = write(outside / "hostname", "not for the device\n")
    rel = {"dotdot": "../../outside/hostname", "absolute": str(secret),
           "sibling-prefix": "../b-evil/hostname"}.get(how)
    if how in ("symlink", "symlink-to-sibling-prefix"):
        (manifest.parent / "link.model").symlink_to(secret)
        rel = "link.model"
    elif how == "symlinked-dir":
        (manifest.parent / "sub").symlink_to(secret.parent, target_is_directory=True)
        rel = "sub/hostname"
    _point_tokenizer_at(manifest, secret, rel)
    index = [f["name"] for f in json.loads(manifest.read_text())["files"]].index("tokenizer.model")

    with pytest.raises(UsageError) as caught:
        bundle_mod.load(manifest)
    message = str(caught.value)
    assert f"files[{index}]" in message and repr(rel) in message, message
    assert "outside the manifest's directory" in message or "is absolute" in message

    result = _farm("bundle", "verify", str(manifest))  # the CLI runs the same checks
    assert result.exit_code == 2 and f"files[{index}]" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_verify_refuses_a_file_swapped_for_a_link_into_a_sibling_prefix_directory(tmp_path):
    """After loading, a bundle file replaced by a link into bundles/b-evil (same bytes, so size and
    sha256 still match) is refused: verify_bundle re-checks containment, by components."""
    manifest = make_qnn_bundle(tmp_path / "bundles" / "b")
    b = bundle_mod.load(manifest, verify=True)
    tokenizer = manifest.parent / "tokenizer.model"
    twin = write(tmp_path / "bundles" / "b-evil" / "tokenizer.model", tokenizer.read_text())
    tokenizer.unlink()
    tokenizer.symlink_to(twin)
    index = [f.name for f in b.files].index("tokenizer.model")
    with pytest.raises(UsageError, match=r"outside the manifest's directory") as caught:
        verify_bundle(b)
    assert f"files[{index}]" in str(caught.value) and "b-evil" in str(caught.value)
    with pytest.raises(UsageError, match=r"outside the manifest's directory"):
        bundle_mod.load(manifest, verify=True)


def test_symlink_inside_the_bundle_is_fine(tmp_path):
    """The containment check follows links; it does not refuse links as such."""
    manifest = make_qnn_bundle(tmp_path / "b")
    target = write(manifest.parent / "real" / "tok.bin", "tok")
    (manifest.parent / "tok-link").symlink_to(target)
    _point_tokenizer_at(manifest, target, "tok-link")
    b = bundle_mod.load(manifest, verify=True)
    assert next(f for f in b.files if f.name == "tokenizer.model").path == target.resolve()


def test_bundle_create_places_outside_artifacts_inside_the_bundle(tmp_path):
    """`farm bundle create` from build outputs elsewhere still gives a manifest that loads."""
    src = make_qnn_bundle(tmp_path / "build")  # reuse its files as "artifacts"
    sdk = tmp_path / "sdk"
    for lib in ("libQnnHtp.so", "libQnnHtpPrepare.so", "libQnnSystem.so", "libQnnHtpV75Stub.so"):
        write(sdk / "lib" / "aarch64-android" / lib, lib)
    write(sdk / "lib" / "hexagon-v75" / "unsigned" / "libQnnHtpV75Skel.so", "skel")
    manifest = tmp_path / "bundles" / "x" / "manifest.json"
    result = _farm("bundle", "create", str(manifest), "--name", "x", "--pte", f"kv={src.parent / 'kv.pte'}",
                   "--tokenizer", str(src.parent / "tokenizer.model"),
                   "--runner", str(src.parent / "qnn_llama_runner"),
                   "--backend-lib", str(src.parent / "libqnn_executorch_backend.so"),
                   "--qnn-sdk", str(sdk), "--htp-arch", "v75")
    assert result.exit_code == 0, result.output
    b = bundle_mod.load(manifest, verify=True)
    base = manifest.parent.resolve()
    assert all(f.path.is_relative_to(base) for f in b.files)
    assert {f.name for f in b.files_for("v75")} >= {"kv.pte", "libQnnHtpV75Skel.so", "libQnnHtp.so"}
    raw = json.loads(manifest.read_text())
    assert not any(f["path"].startswith(("..", "/")) for f in raw["files"])


# -- verify_bundle -------------------------------------------------------------------------------


def test_corrupted_same_size_file_is_refused_naming_both_digests(tmp_path):
    manifest = make_qnn_bundle(tmp_path / "b")
    b = bundle_mod.load(manifest)
    verify_bundle(b)
    pte = manifest.parent / "kv.pte"
    good = _corrupt_in_place(pte)
    index = [f.name for f in b.files].index("kv.pte")
    with pytest.raises(UsageError) as caught:
        verify_bundle(b)
    message = str(caught.value)
    assert f"files[{index}]" in message and str(pte) in message
    assert _sha(good) in message and _sha(pte.read_bytes()) in message
    with pytest.raises(UsageError, match=_sha(pte.read_bytes())):
        bundle_mod.load(manifest, verify=True)
    result = _farm("bundle", "verify", str(manifest))
    assert result.exit_code == 2 and _sha(good) in result.output
    pte.write_bytes(good)
    verify_bundle(b)  # restored: passes again


def test_truncated_file_is_refused(tmp_path):
    manifest = make_qnn_bundle(tmp_path / "b")
    b = bundle_mod.load(manifest)
    pte = manifest.parent / "hybrid.pte"
    size = pte.stat().st_size
    with open(pte, "r+b") as f:
        f.truncate(size - 10)
    with pytest.raises(UsageError, match=rf"{size - 10} bytes, manifest says {size}"):
        verify_bundle(b)
    with pytest.raises(UsageError, match=rf"hybrid.pte is {size - 10} bytes"):
        bundle_mod.load(manifest)


def test_verify_hashes_each_unchanged_file_once(tmp_path, monkeypatch):
    manifest = make_qnn_bundle(tmp_path / "b")
    b = bundle_mod.load(manifest)
    time.sleep(bundle_mod.RACY_NS / 1e9 + 0.1)  # let the new files settle (see file_digest)
    hashed: list[Path] = []
    real = bundle_mod.sha256_file
    monkeypatch.setattr(bundle_mod, "sha256_file", lambda p, *a: hashed.append(Path(p)) or real(p, *a))
    verify_bundle(b)
    assert 0 < len(hashed) <= len(b.files)
    hashed.clear()
    for _ in range(3):
        verify_bundle(b)
    assert hashed == []  # unchanged: nothing read again
    pte = manifest.parent / "kv.pte"
    _corrupt_in_place(pte)
    with pytest.raises(UsageError, match="sha256"):
        verify_bundle(b)
    assert hashed == [pte.resolve()]  # only the changed file


def test_a_file_changed_within_the_same_clock_tick_is_not_trusted(tmp_path, monkeypatch):
    """A fresh file is not cached: file times are coarse, so a rewrite within the same tick keeps
    size, mtime and ctime. Simulated with an identity blind to times: the rewrite is still seen."""
    monkeypatch.setattr(bundle_mod, "_identity", lambda path, st: (str(path), st.st_size, 0, 0,
                                                                    st.st_ino, st.st_dev))
    manifest = make_qnn_bundle(tmp_path / "b")
    b = bundle_mod.load(manifest, verify=True)
    _corrupt_in_place(manifest.parent / "kv.pte")
    with pytest.raises(UsageError, match="sha256"):
        verify_bundle(b)


# -- deploy --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def device_farm(tmp_path_factory, deploy_mode):
    with VirtualFarm(home=tmp_path_factory.mktemp("integrity-farm")) as vf:
        (record,) = vf.up([VirtualDeviceSpec(soc="SM8650")])
        yield vf, record


def _device(vf, record):
    return find_device([vf.adb_server], record.serial)


def _ws(vf, device, bundle) -> Path:
    """The bundle's workspace on the host: where the virtual device keeps its /data/... path."""
    return vf.device(device.serial).host_path(bundle_workspace(device, bundle))


def _record(ws: Path) -> dict:
    return json.loads((ws / RECORD_NAME).read_text())["files"]


def test_deploy_refuses_corrupt_host_file_then_pushes_the_restored_one(device_farm, tmp_path):
    vf, rec = device_farm
    manifest = make_qnn_bundle(tmp_path / "b", name="corrupt-then-restored")
    bundle = bundle_mod.load(manifest)  # loaded (sizes checked), then corrupted before deploy
    device = _device(vf, rec)
    pte = manifest.parent / "kv.pte"
    good = _corrupt_in_place(pte)
    bad_sha = _sha(pte.read_bytes())
    with pytest.raises(UsageError) as caught:
        deploy(device, bundle)
    message = str(caught.value)
    assert str(pte) in message and _sha(good) in message and bad_sha in message
    ws = _ws(vf, device, bundle)
    assert not (ws / "kv.pte").exists()  # nothing corrupt under the real name
    wait_for_sync_sessions_to_end(vf, rec.serial)  # an aborted push's device temp file goes with it
    assert not [p for p in ws.iterdir() if PARTIAL_SUFFIX in p.name]
    assert not (ws / RECORD_NAME).exists() or "kv.pte" not in _record(ws)

    pte.write_bytes(good)  # restored: the next deploy pushes it, the device ends with the good bytes
    report = deploy(device, bundle)
    assert "kv.pte" in report.pushed
    assert (ws / "kv.pte").read_bytes() == good
    record = _record(ws)
    for f in bundle.files_for(device.htp_arch):  # the record holds the digests of the device's bytes
        assert record[f.name]["sha256"] == _sha((ws / f.name).read_bytes()) == f.sha256
    assert deploy(device, bundle).files_pushed == 0


def test_a_corrupt_file_never_replaces_a_good_one_on_the_device(device_farm, tmp_path):
    vf, rec = device_farm
    manifest = make_qnn_bundle(tmp_path / "b", name="keep-good")
    bundle = bundle_mod.load(manifest)
    device = _device(vf, rec)
    deploy(device, bundle)
    ws = _ws(vf, device, bundle)
    pte = manifest.parent / "kv.pte"
    good = pte.read_bytes()
    (ws / "kv.pte").write_bytes(b"x" * len(good))  # the device's copy is damaged: a push is due ...
    _corrupt_in_place(pte)  # ... and the host file is corrupt too
    with pytest.raises(UsageError, match="manifest says"):
        deploy(device, bundle)
    assert (ws / "kv.pte").read_bytes() == b"x" * len(good)  # not replaced by the corrupt bytes
    wait_for_sync_sessions_to_end(vf, rec.serial)
    assert not [p for p in ws.iterdir() if PARTIAL_SUFFIX in p.name]
    pte.write_bytes(good)
    assert "kv.pte" in deploy(device, bundle).pushed
    assert (ws / "kv.pte").read_bytes() == good


def test_leftover_temp_files_of_any_shape_are_removed(device_farm, tmp_path):
    vf, rec = device_farm
    bundle = bundle_mod.load(make_qnn_bundle(tmp_path / "b", name="leftovers"))
    device = _device(vf, rec)
    ws = _ws(vf, device, bundle)
    ws.mkdir(parents=True, exist_ok=True)
    leftovers = ["kv.pte" + PARTIAL_SUFFIX, f".kv.pte{PARTIAL_SUFFIX}{PARTIAL_SUFFIX}-4242",
                 f".{RECORD_NAME}{PARTIAL_SUFFIX}.ptefarm-partial-7"]
    for name in leftovers:
        (ws / name).write_bytes(b"half")
    deploy(device, bundle)
    assert not [p.name for p in ws.iterdir() if PARTIAL_SUFFIX in p.name]
    assert sorted(p.name for p in ws.iterdir() if p.is_file()) == sorted(
        [RECORD_NAME, *(f.name for f in bundle.files_for(device.htp_arch))])


def test_a_file_name_with_a_line_separator_is_not_pushed_again(device_farm, tmp_path):
    vf, rec = device_farm
    manifest = make_qnn_bundle(tmp_path / "b", name="u2028")
    odd = write(manifest.parent / "odd.txt", "odd")
    b = bundle_mod.load(manifest)
    b.files.append(describe_file(manifest.parent, odd, role="other", name="odd\u2028name\x85.txt"))
    b.write(manifest)
    bundle = bundle_mod.load(manifest)
    device = _device(vf, rec)
    first = deploy(device, bundle)
    assert "odd\u2028name\x85.txt" in first.pushed
    again = deploy(device, bundle)
    assert again.files_pushed == 0 and again.files_hashed == 0


def test_name_holding_the_temp_suffix_is_refused(device_farm, tmp_path):
    vf, rec = device_farm
    manifest = make_qnn_bundle(tmp_path / "b", name="suffix-name")
    b = bundle_mod.load(manifest)
    b.files.append(describe_file(manifest.parent, write(manifest.parent / "y", "y"), role="other",
                                 name=f"y{PARTIAL_SUFFIX}-1"))
    with pytest.raises(UsageError, match="not a plain workspace name"):
        deploy(_device(vf, rec), b)


def test_full_device_is_infra_naming_device_and_bytes(tmp_path, deploy_mode):
    bundle = bundle_mod.load(make_qnn_bundle(tmp_path / "b", name="full", pte_bytes=300_000))
    with VirtualFarm(home=tmp_path / "farm") as vf:
        (record,) = vf.up([VirtualDeviceSpec(soc="SM8650")])
        device = find_device([vf.adb_server], record.serial)
        need = sum(f.size for f in bundle.files_for(device.htp_arch))
        if deploy_mode == "chunked":  # random bytes: every chunk is new, and written twice (the
            need += sum(f.size for f in bundle.files_for(device.htp_arch)  # chunk, the file)
                        if f.size >= CHUNKED_FROM_BYTES)
        vf.set_faults(record.serial, disk_full_after_bytes=50_000)
        with pytest.raises(AdbError) as caught:
            deploy(device, bundle, timeout=10)
        message = str(caught.value)
        assert isinstance(caught.value, InfraError) and caught.value.serial == record.serial
        assert record.serial in message and f"needs {need} bytes" in message, message
        ws = _ws(vf, device, bundle)
        assert not (ws / RECORD_NAME).exists()  # nothing half-deployed counted as deployed
        wait_for_sync_sessions_to_end(vf, record.serial)
        assert not [p for p in ws.iterdir() if PARTIAL_SUFFIX in p.name]
        vf.clear_faults(record.serial)
        deploy(device, bundle, timeout=10)
        assert (ws / "kv.pte").read_bytes() == (tmp_path / "b" / "kv.pte").read_bytes()


# -- runs ----------------------------------------------------------------------------------------

# A runner with magic first prompts: NOOUT exits 0 and writes nothing, EMPTY writes an empty
# outputs.txt, NOISY writes 8 stderr lines and exits 3; anything else behaves.
ODD_RUNNER = r'''#!/usr/bin/env python3
import sys
args = sys.argv[1:]
opts = {args[i]: args[i + 1] for i in range(0, len(args) - 1, 2) if args[i].startswith("--")}
prompt = opts.get("--prompt", "")
for i in range(8):
    print(f"log line {i}", file=sys.stderr)
if prompt == "NOISY":
    sys.exit(3)
if prompt == "NOOUT":
    sys.exit(0)
with open(opts["--output_path"], "w") as f:
    f.write("" if prompt == "EMPTY" else prompt + " and more")
with open(opts["--performance_output_path"], "w") as f:
    f.write("1.0\n")
'''


@pytest.fixture(scope="module")
def odd(tmp_path_factory, device_farm):
    vf, rec = device_farm
    root = tmp_path_factory.mktemp("odd") / "b"
    manifest = make_qnn_bundle(root, name="odd-runner")
    write(root / "qnn_llama_runner", ODD_RUNNER)
    runner = describe_file(root, root / "qnn_llama_runner", role="runner")

    def edit(raw):
        entry = next(f for f in raw["files"] if f["name"] == "qnn_llama_runner")
        entry.update(size=runner.size, sha256=runner.sha256)

    _edit_manifest(manifest, edit)
    bundle = bundle_mod.load(manifest, verify=True)
    device = _device(vf, rec)
    deploy(device, bundle)
    return device, bundle


def test_runner_exiting_0_without_outputs_is_run_incomplete(odd):
    device, bundle = odd
    assert run(device, bundle, RunRequest(prompts=["fine"]), timeout=60).text == "fine and more"
    for prompt, missing in (("NOOUT", "no outputs.txt"), ("EMPTY", "an empty outputs.txt")):
        with pytest.raises(RunIncomplete) as caught:
            run(device, bundle, RunRequest(prompts=[prompt]), timeout=60)
        e = caught.value
        assert isinstance(e, InfraError) and not isinstance(e, AssertionError)
        assert e.exit_code == 0 and e.missing == missing and e.serial == device.serial
        assert "log line 7" in e.stderr_tail and "log line 7" in str(e)
        assert "exited 0" in str(e) and missing in str(e)
        assert "\n" not in str(e)


def test_runner_failure_carries_exit_code_and_stderr_tail(odd):
    device, bundle = odd
    with pytest.raises(RunnerFailed) as caught:
        run(device, bundle, RunRequest(prompts=["NOISY"]), timeout=60)
    message = str(caught.value)
    assert "exited 3" in message and "\n" not in message
    assert all(f"log line {i}" in message for i in range(3, 8))
    assert "log line 2" not in message  # the tail, not all of it ...
    assert all(f"log line {i}" in caught.value.result.stderr for i in range(8))  # ... which is here


def _result(**kw) -> RunResult:
    base = dict(serial="dev", bundle="b", mode="kv", updater="SmartMask", command="c", exit_code=0,
                stdout="", stderr="boom\n", duration_s=0.1)
    return RunResult(**{**base, **kw})


def test_no_generated_tokens_is_incomplete_when_the_dialect_writes_ids():
    with_ids = RunnerCommand(argv=[], shell="", out_dir="/w/runs/1",
                             outputs={"outputs": "outputs.txt", "token_ids": "token_ids.json"})
    without = RunnerCommand(argv=[], shell="", out_dir="/w/runs/1", outputs={"outputs": "outputs.txt"})
    text = dict(text="hi", text_bytes=b"hi")
    check_complete(_result(**text, generated_ids=[5]), with_ids)
    check_complete(_result(**text), without)
    with pytest.raises(RunIncomplete, match="no generated tokens in token_ids.json"):
        check_complete(_result(**text, generated_ids=[]), with_ids)
    with pytest.raises(RunIncomplete, match="no readable token_ids.json"):
        check_complete(_result(**text), with_ids)
    with pytest.raises(RunIncomplete, match="boom"):
        check_complete(_result(text="", text_bytes=b""), without)


# -- compare -------------------------------------------------------------------------------------


def _comparison(**per_updater) -> Comparison:
    c = Comparison(serial="dev", mode="kv", prompt="p", seq_len=8)
    for updater in UPDATER_PAIR:
        c.results[updater] = _result(updater=updater, **per_updater)
    return c


@pytest.mark.parametrize("outputs", [
    dict(generated_ids=[], text_bytes=b"prompt"),  # token ids: none generated
    dict(text_bytes=b""),  # text: both empty
    dict(text_bytes=None),  # text: neither wrote outputs.txt
])
def test_two_empty_outputs_never_agree(outputs):
    c = _comparison(**outputs)
    assert c.agree is False
    assert "produced no" in c.explain() and "both" in c.explain()
    assert c.tok_s() == {u: None for u in UPDATER_PAIR}


def test_equal_non_empty_outputs_agree_and_one_empty_side_does_not():
    assert _comparison(generated_ids=[1, 2, 3]).agree
    assert _comparison(text_bytes=b"same").explain().endswith("agree on 4 text")
    c = _comparison(generated_ids=[1, 2])
    c.results[UPDATER_PAIR[1]].generated_ids = []
    assert not c.agree and UPDATER_PAIR[1] in c.explain() and c.first_divergence() == 0
    partial = _comparison(generated_ids=[1])
    del partial.results[UPDATER_PAIR[0]]
    assert not partial.agree and "no result for" in partial.explain()


@pytest.mark.parametrize("command", ["deploy", "run"])
def test_cli_refuses_a_corrupt_bundle_in_the_push_and_leaves_nothing_of_it(device_farm, tmp_path,
                                                                           command):
    """``farm deploy`` and ``farm run`` check the sha256 of each file as they push it (one read of a
    new bundle): a corrupt file is bad input (exit 2) naming the file and both digests, nothing of it
    stays on the device, nothing runs, and the restored bundle then deploys."""
    vf, rec = device_farm
    manifest = make_qnn_bundle(tmp_path / "b", name=f"cli-corrupt-{command}")
    pte = manifest.parent / "kv.pte"
    good = _corrupt_in_place(pte)
    config = write(tmp_path / "farm.toml", f'[[adb_servers]]\nhost = "127.0.0.1"\n'
                                           f'port = {vf.adb_server.port}\n')
    extra = ["--prompt", "x"] if command == "run" else []
    result = _farm(command, str(manifest), "--serial", rec.serial, "--config", str(config), *extra)
    assert result.exit_code == 2, result.output
    assert str(pte) in result.output and "manifest says" in result.output
    assert _sha(good) in result.output and _sha(pte.read_bytes()) in result.output
    bundle = bundle_mod.load(manifest)
    device = _device(vf, rec)
    ws = _ws(vf, device, bundle)
    wait_for_sync_sessions_to_end(vf, rec.serial)
    assert not (ws / "kv.pte").exists()
    assert not [p for p in ws.iterdir() if PARTIAL_SUFFIX in p.name]
    assert not (ws / RECORD_NAME).exists() or "kv.pte" not in _record(ws)
    assert not (ws / "outputs").exists() and not list(ws.glob("*.txt"))  # nothing ran

    pte.write_bytes(good)
    again = _farm("deploy", str(manifest), "--serial", rec.serial, "--config", str(config))
    assert again.exit_code == 0, again.output
    assert (ws / "kv.pte").read_bytes() == good
