"""The pytest plugin end to end: pytest runs in a subprocess on virtual devices, and the tests read
back what a CI system would (the JUnit files, results.json) and what the pool recorded (its events)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from farm.pool import Pool
from farm.virtual import VirtualDeviceSpec
from tests.device_helpers import make_qnn_bundle
from tests.plugin_helpers import (
    REPO,
    SUITES,
    explain,
    farm_toml,
    junit_cases,
    results_json,
    run_pytest,
    write_cases,
)

def _case_toml(*cases: tuple[str, str, int]) -> str:
    """A correctness case file: (name, prompt, seq_len) in kv mode each."""
    return "\n".join(f'[[case]]\nname = "{name}"\nprompt = {json.dumps(prompt)}\nmodes = ["kv"]\n'
                     f"seq_lens = [{seq_len}]\n" for name, prompt, seq_len in cases)


THREE_CASES = _case_toml(("story", "Once upon a time", 64),
                         ("hostile", "x $(reboot) `id`; echo '<|eot_id|>'", 64), ("short", "Hi", 48))
ONE_CASE = _case_toml(("story", "Once upon a time", 64))


def _pool_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'pool.db'}"


def _leases(tmp_path) -> list:
    with Pool.open(_pool_url(tmp_path)) as pool:
        return pool.history(limit=None)


def test_three_socs_four_devices_under_xdist(virtual_farm, tiny_bundle, tmp_path):
    devices = virtual_farm.up([VirtualDeviceSpec(soc=s) for s in ("SM8650", "SM8650", "SM8550",
                                                                   "SM8750")])
    config = farm_toml(tmp_path / "farm.toml", virtual_farm.adb_server.port, _pool_url(tmp_path))
    cases = write_cases(tmp_path / "cases.toml", THREE_CASES)
    out = tmp_path / "out"
    proc = run_pytest([str(SUITES / "test_correctness.py"), str(SUITES / "test_smoke.py"),
                       "-k", "updaters_agree or device_answers", "-n", "4",
                       "--farm-config", str(config), "--farm-bundle", str(tiny_bundle),
                       "--farm-cases", str(cases), "--farm-out", str(out)], cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    cases = junit_cases(out)
    names = [c.name for c in cases]
    expected = {f"test_updaters_agree[{soc}-kv-{case}]" for soc in ("SM8650", "SM8550", "SM8750")
                for case in ("story", "hostile", "short")}
    expected |= {f"test_device_answers[{soc}]" for soc in ("SM8650", "SM8550", "SM8750")}
    assert sorted(names) == sorted(expected)  # every test exactly once, across all the files
    soc_of = {d.serial: d.soc for d in devices}
    for c in cases:
        assert c.outcome == "passed", c
        assert c.properties["soc"] == soc_of[c.properties["serial"]]
        assert c.suite == c.properties["serial"]  # one <testsuite> per device
        assert c.properties["htp_arch"] and c.properties["virtual"] == "true"
        assert c.properties["bundle"] == "reference-tiny" and len(c.properties["bundle_digest"]) == 64
        assert c.properties["runner_dialect"] == "host"
        if "updaters_agree" in c.name:
            assert c.properties["mode"] == "kv" and c.properties["seq_len"] in ("48", "64")
            assert float(c.properties["tok_s.SmartMask"]) > 0
    # The pool's own log: every lease went to a device of the test's SoC, and all four were used.
    leased = [e for e in _leases(tmp_path) if e.kind == "leased"]
    assert len(leased) == len(expected)
    for e in leased:
        nodeid = e.holder.rpartition("(")[2].rstrip(")")
        soc = nodeid.rpartition("[")[2].split("-")[0].rstrip("]")
        assert soc_of[e.serial] == soc, (e.serial, nodeid)
    assert {e.serial for e in leased} == set(soc_of)
    meta = results_json(out)["meta"]
    assert meta["verdict"] == "pass" and meta["capacity"] == {"SM8550": 1, "SM8650": 2, "SM8750": 1}


def test_diverging_updaters_fail_with_the_first_difference(tmp_path):
    """A runner whose output depends on --kv_updater (the fake echoes its argv) fails the suite."""
    manifest = make_qnn_bundle(tmp_path / "bundle")
    out = tmp_path / "out"
    proc = run_pytest([str(SUITES / "test_correctness.py"), "-k", "updaters_agree",
                       "--farm-virtual", "SM8650", "--farm-bundle", str(manifest), "--farm-cases",
                       str(write_cases(tmp_path / "cases.toml", ONE_CASE)), "--farm-out", str(out)],
                      cwd=tmp_path)
    assert proc.returncode == 1, explain(proc)
    [case] = junit_cases(out)
    assert case.outcome == "failed"
    assert "diverge at output text index" in case.message
    assert results_json(out)["meta"]["verdict"] == "fail"


def test_threshold_above_the_device_fails_throughput(tiny_bundle, tmp_path):
    thresholds = tmp_path / "thresholds.toml"
    thresholds.write_text("warmup = 0\nruns = 2\n"
                          '[[min]]\nsoc = "*"\nmode = "kv"\nseq_len = 24\nupdater = "SmartMask"\n'
                          "tok_s = 1e9\n"
                          '[[min]]\nsoc = "SM8650"\nmode = "kv"\nseq_len = 24\n'
                          'updater = "ShiftPointer"\ntok_s = 1.0\n')
    out = tmp_path / "out"
    proc = run_pytest([str(SUITES / "test_throughput.py"), "-k", "min_throughput",
                       "--farm-virtual", "SM8650", "--farm-bundle", str(tiny_bundle),
                       "--farm-thresholds", str(thresholds), "--farm-out", str(out)], cwd=tmp_path)
    assert proc.returncode == 1, explain(proc)
    by_name = {c.name: c for c in junit_cases(out)}
    failed = by_name["test_min_throughput[SM8650-kv-24-SmartMask]"]
    assert failed.outcome == "failed" and "< minimum 1e+09" in failed.message
    assert "virtual" in failed.message  # virtual-device figures say so
    assert len(failed.properties["tok_s_runs.SmartMask"].split()) == 2  # every measured run kept
    assert by_name["test_min_throughput[SM8650-kv-24-ShiftPointer]"].outcome == "passed"


KILLER = """
import json, os, signal

def test_generate(llm, device):
    pids = json.loads(os.environ["VICTIM_PIDS"])
    marker = os.environ["KILLED_MARKER"]
    if not os.path.exists(marker):  # the first attempt kills its own device, mid-test
        with open(marker, "w") as f:
            f.write(device.serial)
        os.kill(pids[device.serial], signal.SIGKILL)
    result = llm.generate("Once upon a time", mode="kv", seq_len=40)
    assert result.text
"""


def test_killed_device_is_an_error_then_a_retry_elsewhere(virtual_farm, tiny_bundle, tmp_path):
    devices = virtual_farm.up([VirtualDeviceSpec(soc="SM8650"), VirtualDeviceSpec(soc="SM8650")])
    config = farm_toml(tmp_path / "farm.toml", virtual_farm.adb_server.port, _pool_url(tmp_path))
    (tmp_path / "test_killer.py").write_text(KILLER)
    marker = tmp_path / "killed"
    out = tmp_path / "out"
    proc = run_pytest(["test_killer.py", "--farm-config", str(config), "--farm-bundle",
                       str(tiny_bundle), "--farm-retry-delay", "0.2", "--farm-out", str(out)],
                      cwd=tmp_path, env={"VICTIM_PIDS": json.dumps({d.serial: d.pid for d in devices}),
                                         "KILLED_MARKER": str(marker)})
    assert proc.returncode == 0, explain(proc)
    victim = marker.read_text()
    [case] = junit_cases(out)
    assert case.outcome == "passed"
    assert case.properties["serial"] != victim  # the retry went to the other device
    assert case.properties["attempts"] == "2"
    assert victim in case.system_err  # the spoiled attempt and its reason are in the report
    [record] = results_json(out)["results"]
    assert record["attempts"][0]["serial"] == victim
    with Pool.open(_pool_url(tmp_path)) as pool:
        states = {d.device.serial: d.device.state for d in pool.status().devices}
    assert states[victim] in ("offline", "quarantined")


POOL_FLAKY_CONFTEST = """
from farm.errors import PoolError
from farm.pool.leases import Pool

def _down(self, *args, **kwargs):
    raise PoolError("pool database unreachable (injected by the test)")

Pool.record_success = _down
Pool.record_infra_failure = _down
Pool.release = _down
"""
THREE_GENERATIONS = """
import pytest

@pytest.mark.parametrize("prompt", ["one", "two", "three"])
def test_generate(llm, prompt):
    assert llm.generate(prompt, mode="kv", seq_len=32).text
"""


def test_pool_errors_mid_case_never_hang_and_never_drop_a_case(tiny_bundle, tmp_path):
    (tmp_path / "conftest.py").write_text(POOL_FLAKY_CONFTEST)
    (tmp_path / "test_three.py").write_text(THREE_GENERATIONS)
    config = tmp_path / "farm.toml"
    config.write_text("[pool]\nlease_ttl_s = 3\n")  # an unreleased lease comes back quickly
    out = tmp_path / "out"
    proc = run_pytest(["test_three.py", "-n", "2", "--farm-virtual", "SM8650", "--farm-config",
                       str(config), "--farm-bundle", str(tiny_bundle), "--farm-out", str(out)],
                      cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, explain(proc)
    cases = junit_cases(out)
    assert sorted(c.name for c in cases) == [f"test_generate[SM8650-{p}]" for p in
                                             ("one", "three", "two")]
    assert {c.outcome for c in cases} == {"passed"}


def test_shared_buffer_bundle_qualifies_against_goldens(tmp_path):
    """A v1.1+ runner has SmartMask only: the pairwise test is skipped with the reason, and the
    goldens decide. A golden that does not match fails."""
    manifest = make_qnn_bundle(tmp_path / "bundle", dialect="qnn-shared-buffer")
    goldens = manifest.parent / "goldens.toml"
    goldens.write_text('[[golden]]\ncase = "story"\ntext_prefix = "{\\"argv\\": [\\"--model_path\\""\n')
    cases = write_cases(tmp_path / "cases.toml", ONE_CASE)
    out = tmp_path / "out"
    args = [str(SUITES / "test_correctness.py"), str(SUITES / "test_smoke.py"), "--farm-virtual",
            "SM8650", "--farm-bundle", str(manifest), "--farm-cases", str(cases), "--farm-out", str(out)]
    proc = run_pytest(args, cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    by_name = {c.name: c for c in junit_cases(out)}
    skipped = by_name["test_updaters_agree[SM8650-kv-story]"]
    assert skipped.outcome == "skipped" and "only SmartMask" in skipped.message
    assert by_name["test_matches_golden[SM8650-kv-story]"].outcome == "passed"
    assert results_json(out)["meta"]["verdict"] == "pass"

    goldens.write_text('[[golden]]\ncase = "story"\ntext_prefix = "Once upon a time,"\n')
    proc = run_pytest(args, cwd=tmp_path)
    assert proc.returncode == 1, explain(proc)
    assert {c.name: c for c in junit_cases(out)}["test_matches_golden[SM8650-kv-story]"].outcome \
        == "failed"


def test_unknown_soc_fails_fast(tiny_bundle, tmp_path):
    started = time.monotonic()
    proc = run_pytest([str(SUITES / "test_smoke.py"), "--farm-virtual", "SM8650", "--farm-soc",
                       "SM9999", "--farm-bundle", str(tiny_bundle)], cwd=tmp_path)
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, explain(proc)
    assert "no device for SoC SM9999" in proc.stderr and "SM8650 (1)" in proc.stderr
    assert time.monotonic() - started < 60  # not a lease timeout


def test_two_pytest_runs_share_one_pool_without_a_double_lease(virtual_farm, tiny_bundle, tmp_path):
    virtual_farm.up([VirtualDeviceSpec(soc="SM8650"), VirtualDeviceSpec(soc="SM8650")])
    config = farm_toml(tmp_path / "farm.toml", virtual_farm.adb_server.port, _pool_url(tmp_path))
    (tmp_path / "test_three.py").write_text(THREE_GENERATIONS)
    env = {**os.environ}
    procs = [subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                               "--rootdir", str(tmp_path), "test_three.py", "--farm-config", str(config),
                               "--farm-bundle", str(tiny_bundle), "--farm-priority", prio],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for prio in ("pr", "nightly")]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    holder: dict[str, str | None] = {}
    grants = 0
    for e in _leases(tmp_path):
        if e.kind == "leased":
            assert holder.get(e.serial) is None, f"{e.serial} leased twice: {e}"
            holder[e.serial] = e.token
            grants += 1
        elif e.kind in ("released", "expired") and e.serial in holder:
            assert holder[e.serial] == e.token
            holder[e.serial] = None
    assert grants == 6 and not any(holder.values())


def test_a_users_own_test_file_runs(tiny_bundle, tmp_path):
    out = tmp_path / "out"
    proc = run_pytest([str(REPO / "examples" / "test_my_bundle.py"), "--farm-virtual", "SM8650",
                       "--farm-virtual", "SM8550", "--farm-bundle", str(tiny_bundle), "--farm-out",
                       str(out)], cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)
    names = sorted(c.name for c in junit_cases(out))
    assert names == sorted(["test_story_is_greedy[SM8650]", "test_story_is_greedy[SM8550]",
                            "test_each_updater_generates[SM8650-SmartMask]",
                            "test_each_updater_generates[SM8650-ShiftPointer]",
                            "test_device_identity[SM8650]", "test_device_identity[SM8550]"])


def test_corrupted_bundle_is_refused_before_any_lease(tiny_bundle, tmp_path):
    import shutil

    copy = tmp_path / "bundle"
    shutil.copytree(tiny_bundle.parent, copy)
    pte = copy / "kv_llama_xnnpack.pte"
    data = bytearray(pte.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other content
    pte.write_bytes(bytes(data))
    proc = run_pytest([str(SUITES / "test_smoke.py"), "--farm-virtual", "SM8650", "--farm-bundle",
                       str(copy / "manifest.json")], cwd=tmp_path)
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, explain(proc)
    assert "kv_llama_xnnpack.pte" in proc.stderr


def test_sigint_releases_leases_and_writes_a_partial_report(virtual_farm, tiny_bundle, tmp_path):
    virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    config = farm_toml(tmp_path / "farm.toml", virtual_farm.adb_server.port, _pool_url(tmp_path))
    (tmp_path / "test_slow.py").write_text(
        "import pytest, time\n"
        "@pytest.mark.parametrize('i', range(3))\n"
        "def test_slow(device, i):\n"
        "    if i == 1:\n"
        "        open('started', 'w').close()\n"
        "        time.sleep(120)\n")
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                             "--rootdir", str(tmp_path), "test_slow.py", "--farm-config", str(config),
                             "--farm-bundle", str(tiny_bundle), "--farm-out", str(out)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not (tmp_path / "started").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    output = proc.communicate(timeout=60)[0]
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, output
    meta = results_json(out)["meta"]
    assert meta["partial"] is True
    outcomes = {r["nodeid"].rpartition("::")[2]: r["outcome"] for r in results_json(out)["results"]}
    assert outcomes["test_slow[SM8650-0]"] == "passed"  # finished before the signal: kept
    with Pool.open(_pool_url(tmp_path)) as pool:
        assert [d.lease for d in pool.status().devices] == [None]  # released, not left to its TTL


CRASHER = """
import os

def test_crash_once(device):
    if not os.path.exists(os.environ["CRASHED_MARKER"]):
        open(os.environ["CRASHED_MARKER"], "w").write(device.serial)
        os._exit(1)  # the xdist worker dies mid-test, holding its lease

def test_other(device):
    pass
"""


def test_a_crashed_workers_test_runs_again_elsewhere(tiny_bundle, tmp_path):
    (tmp_path / "test_crasher.py").write_text(CRASHER)
    config = tmp_path / "farm.toml"
    config.write_text("[pool]\nlease_ttl_s = 3\n")  # the dead worker's lease comes back quickly
    out = tmp_path / "out"
    proc = run_pytest(["test_crasher.py", "-n", "2", "--farm-virtual", "SM8650:2", "--farm-config",
                       str(config), "--farm-bundle", str(tiny_bundle), "--farm-out", str(out)],
                      cwd=tmp_path, env={"CRASHED_MARKER": str(tmp_path / "crashed")})
    records = {r["nodeid"].rpartition("::")[2]: r for r in results_json(out)["results"]}
    assert records["test_crash_once[SM8650]"]["outcome"] == "passed", explain(proc)
    assert "crashed" in records["test_crash_once[SM8650]"]["attempts"][0]["reason"]
    assert records["test_other[SM8650]"]["outcome"] == "passed"
    assert results_json(out)["meta"]["verdict"] == "pass"


def test_a_hot_phone_is_waited_for_and_never_measured_hot(virtual_farm, tiny_bundle, tmp_path):
    """The battery temperature is set as on a real phone (`dumpsys battery set temp 450`)."""
    import threading

    from farm.devices import find_device

    [dev] = virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    adb = find_device([virtual_farm.adb_server], dev.serial)
    config = farm_toml(tmp_path / "farm.toml", virtual_farm.adb_server.port, _pool_url(tmp_path))
    thresholds = tmp_path / "thresholds.toml"
    thresholds.write_text('warmup = 0\nruns = 1\n[[min]]\nsoc = "*"\nmode = "kv"\nseq_len = 48\n'
                          'updater = "SmartMask"\ntok_s = 1.0\n')
    out = tmp_path / "out"
    args = [str(SUITES / "test_throughput.py"), "-k", "min_throughput", "--farm-config", str(config),
            "--farm-bundle", str(tiny_bundle), "--farm-thresholds", str(thresholds),
            "--farm-max-temp", "40", "--farm-retries", "0", "--farm-out", str(out)]
    assert adb.shell("dumpsys battery set temp 450", timeout=10).exit_code == 0
    proc = run_pytest([*args, "--farm-cool-timeout", "2"], cwd=tmp_path)  # stays hot
    assert proc.returncode == 1, explain(proc)
    [case] = junit_cases(out)
    assert case.outcome == "error" and "45.0 C" in case.message and "too hot" in case.message

    cooled = threading.Timer(2.0, lambda: adb.shell("dumpsys battery reset", timeout=10))
    cooled.start()
    try:
        proc = run_pytest([*args, "--farm-cool-timeout", "120"], cwd=tmp_path)  # cools while waiting
    finally:
        cooled.cancel()
    assert proc.returncode == 0, explain(proc)
    [case] = junit_cases(out)
    assert case.outcome == "passed" and case.properties["battery_temp_c"] == "31.2"


def test_relative_throughput_rule_between_updaters(tmp_path):
    """The fake runner reports 42.5 tok/s for SmartMask and 50.0 for ShiftPointer: SmartMask is 15 %
    slower, so a 10 % rule fails and a 20 % rule passes."""
    manifest = make_qnn_bundle(tmp_path / "bundle")
    out = tmp_path / "out"

    def run_with(pct: float):
        thresholds = tmp_path / f"thresholds-{pct}.toml"
        thresholds.write_text(f'warmup = 1\nruns = 3\n[[relative]]\nsoc = "*"\nmode = "kv"\nseq_len = 64\n'
                              f'faster = "SmartMask"\nslower = "ShiftPointer"\nmax_slowdown_pct = {pct}\n')
        return run_pytest([str(SUITES / "test_throughput.py"), "--farm-virtual", "SM8650",
                           "--farm-bundle", str(manifest), "--farm-thresholds", str(thresholds),
                           "--farm-out", str(out)], cwd=tmp_path)

    proc = run_with(10.0)
    assert proc.returncode == 1, explain(proc)
    [case] = [c for c in junit_cases(out) if c.name.startswith("test_relative")]
    assert case.outcome == "failed"
    assert "SmartMask 42.5 tok/s is more than 10% slower than ShiftPointer 50.0" in case.message
    assert case.properties["tok_s_runs.SmartMask"] == "42.50 42.50 42.50"  # warm-up dropped
    proc = run_with(20.0)
    assert proc.returncode == 0, explain(proc)
