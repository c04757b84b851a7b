"""The runner zygote: a run through it is the run farm-llama-runner makes in-process, minus the imports.

One zygote per test module (its import of torch is the expensive part); runs are real subprocesses of
the client, `farm-llama-runner`'s own main, under a probe that records which modules the client loaded.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from farm import procs
from farm.runner import zygote as zygote_mod

HEAVY = ("torch", "numpy", "executorch")
# The client, as the console script runs it, plus a record of sys.modules at its exit.
PROBE = ("import atexit, json, os, sys\n"
         "atexit.register(lambda: open(os.environ['PROBE_OUT'], 'w').write(json.dumps(sorted(sys.modules))))\n"
         "from farm.runner.main import main\n"
         "main()\n")
DEADLINE_S = 20  # generous: only a run that never ends fails it


@pytest.fixture(scope="module")
def zygote(tmp_path_factory):
    """A zygote tied to this test process; at the end its socket is removed, which must stop it."""
    root = tmp_path_factory.mktemp("zygote")
    sock = root / "z.sock"
    log = root / "zygote.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(zygote_mod.zygote_argv(sock, exit_with_pid=os.getpid()),
                                env=procs.farm_env(), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        assert zygote_mod.wait_ready(sock, timeout=120), procs.log_tail(log)
        yield proc, sock
        sock.unlink()
        assert procs.wait_until(lambda: proc.poll() is not None, DEADLINE_S), \
            "the zygote outlived its socket file"
        assert proc.returncode == 0 and log.read_text() == "", log.read_text()
    finally:
        procs.stop_child(proc, grace=1)


class Run:
    def __init__(self, proc: subprocess.Popen, cwd: Path, out: bytes, err: bytes):
        self.code, self.cwd, self.out, self.err = proc.returncode, cwd, out.decode(), err.decode()
        self.modules = json.loads((cwd / "probe.json").read_text())

    def heavy(self) -> list[str]:
        return [m for m in self.modules if m.split(".")[0] in HEAVY]

    def observer(self) -> list[dict]:
        return [json.loads(line.split(" ", 1)[1]) for line in self.out.splitlines()
                if line.startswith("PyTorchObserver ")]


def start(argv, cwd: Path, socket_path=None, env=None, python_opts=(), **kw) -> subprocess.Popen:
    cwd.mkdir(parents=True, exist_ok=True)
    env = {**procs.farm_env(), **(env or {}), "PROBE_OUT": str(cwd / "probe.json")}
    env.pop("PTEFARM_RUNNER_ZYGOTE", None)
    if socket_path is not None:
        env["PTEFARM_RUNNER_ZYGOTE"] = str(socket_path)
    args = [os.fsencode(a) if isinstance(a, str) else a for a in argv]
    return subprocess.Popen([sys.executable, *python_opts, "-c", PROBE, *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def run(argv, cwd: Path, socket_path=None, env=None, python_opts=(), **kw) -> Run:
    proc = start(argv, cwd, socket_path, env, python_opts, **kw)
    out, err = proc.communicate(timeout=300)
    return Run(proc, cwd, out, err)


def greedy_argv(kv, updater: str, *extra) -> list[str]:
    pte, tok = kv
    return ["--model_path", pte, "--tokenizer_path", tok, "--prompt", "Once upon a time",
            "--seq_len", "64", "--temperature", "0", "--kv_updater", updater, "--eval_mode", "0",
            "--token_ids_path", "token_ids.json", *extra]


def children(zygote_proc) -> list[psutil.Process]:
    return psutil.Process(zygote_proc.pid).children()


def wait_children(zygote_proc, n: int) -> list[psutil.Process]:
    assert procs.wait_until(lambda: len(children(zygote_proc)) >= n, DEADLINE_S, interval=0.01), \
        f"the zygote never had {n} children"
    return children(zygote_proc)


# --- same run ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("updater", ["SmartMask", "ShiftPointer"])
def test_same_outputs_as_in_process(updater, kv, zygote, tmp_path):
    _, sock = zygote
    here = run(greedy_argv(kv, updater), tmp_path / "in-process", umask=0o077)
    there = run(greedy_argv(kv, updater), tmp_path / "zygote", sock, umask=0o077)
    assert here.code == there.code == 0, (here.err, there.err)
    for name in ("outputs.txt", "token_ids.json"):
        assert (there.cwd / name).read_bytes() == (here.cwd / name).read_bytes(), name
        assert stat.S_IMODE((there.cwd / name).stat().st_mode) == 0o600  # the client's umask
    assert json.loads((there.cwd / "token_ids.json").read_text())["generated_ids"]
    assert float((there.cwd / "inference_speed.txt").read_text()) > 0
    # stdout: the same observer line's token counts; stderr: the same bytes.
    counts = [[(s["prompt_tokens"], s["generated_tokens"]) for s in r.observer()] for r in (here, there)]
    assert len(counts[0]) == 1 and counts[0] == counts[1]
    assert there.err == here.err
    # The runner ran in the zygote's child: the client never loaded torch; in-process it did.
    assert there.heavy() == [] and "torch" in here.heavy()


BAD = {
    "unknown flag": ["--no_such_flag", "1"],
    "not a number": ["--seq_len", "many"],
    "no model": ["--model_path", "missing.pte", "--tokenizer_path", "missing.model"],
    "iterations": ["--num_iters", "0"],
    "not UTF-8": ["--prompt", b"caf\xe9"],
}


@pytest.mark.parametrize("name", BAD)
def test_bad_flags_same_exit_code_and_stderr(name, zygote, tmp_path):
    _, sock = zygote
    here = run(BAD[name], tmp_path / "in-process")
    there = run(BAD[name], tmp_path / "zygote", sock)
    assert here.code == there.code == 2
    assert there.err == here.err and there.err.startswith("farm-llama-runner: error: ")
    assert there.out == here.out == ""


def test_client_imports_no_torch(kv, zygote, tmp_path):
    """The whole start-up of a zygote run is the client's: it must not import torch (nor numpy,
    executorch). -X importtime lists what it imported (the forked child imports nothing new)."""
    _, sock = zygote
    r = run(greedy_argv(kv, "SmartMask"), tmp_path, sock, python_opts=["-X", "importtime"])
    assert r.code == 0, r.err
    imported = [line.split("|")[-1].strip() for line in r.err.splitlines()
                if line.startswith("import time:")]
    assert "farm.runner.zygote" in imported and "farm.runner.main" in imported
    assert [m for m in imported if m.split(".")[0] in HEAVY] == []
    assert r.heavy() == []


# --- the run's life ---------------------------------------------------------------------------------

def slow_env(ms_per_token: int) -> dict:
    return {"PTEFARM_RUNNER_DELAY_MS": str(ms_per_token)}  # the engine's virtual-device throttle


def test_killing_the_clients_group_kills_the_run(kv, zygote, tmp_path):
    zproc, sock = zygote
    # ~40 tokens x 2 iterations at 0.5 s a token: it runs until killed.
    client = start(greedy_argv(kv, "SmartMask"), tmp_path, sock, env=slow_env(500),
                   start_new_session=True)
    [child] = wait_children(zproc, 1)
    assert child.is_running()
    os.killpg(client.pid, signal.SIGKILL)  # what the farm's run timeout does to the shell's group
    client.wait(timeout=DEADLINE_S)
    _, alive = psutil.wait_procs([child], timeout=DEADLINE_S)
    assert alive == [], "the run outlived its client"
    client.communicate(timeout=DEADLINE_S)  # its stdout closes with the child
    assert zproc.poll() is None  # the zygote serves on


def test_crashed_child_gives_128_plus_signal_and_the_zygote_survives(kv, zygote, tmp_path):
    zproc, sock = zygote
    client = start(greedy_argv(kv, "SmartMask"), tmp_path / "crash", sock, env=slow_env(500))
    [child] = wait_children(zproc, 1)
    child.send_signal(signal.SIGSEGV)
    _, err = client.communicate(timeout=DEADLINE_S)
    assert client.returncode == 128 + signal.SIGSEGV, err
    after = run(greedy_argv(kv, "SmartMask"), tmp_path / "after", sock)
    assert after.code == 0 and after.heavy() == [], after.err


@pytest.mark.parametrize("via_zygote", [False, True], ids=["in-process", "zygote"])
def test_sigint_is_130_both_ways(via_zygote, kv, zygote, tmp_path):
    """Ctrl-C reaches the runner as KeyboardInterrupt: exit 130, through the zygote as in-process."""
    zproc, sock = zygote
    client = start(greedy_argv(kv, "ShiftPointer"), tmp_path, sock if via_zygote else None,
                   env=slow_env(500))
    # 60 tokens at 500 ms each: once the runtime is in (in-process: its library mapped; through the
    # zygote: the child forked, it was there before), the runner is loading or generating, never done.
    # Not a fixed sleep: on a loaded host two seconds in-process were still inside torch's import.
    if via_zygote:
        wait_children(zproc, 1)
    else:
        assert procs.wait_until(lambda: _maps_portable_lib(client.pid), 120, interval=0.05), \
            client.communicate(timeout=DEADLINE_S)
    time.sleep(0.5)
    assert client.poll() is None, client.communicate(timeout=DEADLINE_S)
    client.send_signal(signal.SIGINT)
    _, err = client.communicate(timeout=DEADLINE_S)
    assert client.returncode == 130, err
    assert b"Traceback" not in err


def _maps_portable_lib(pid: int) -> bool:
    try:
        return "_portable_lib" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def test_two_concurrent_runs(kv, zygote, tmp_path):
    zproc, sock = zygote
    clients = [start(greedy_argv(kv, "ShiftPointer"), tmp_path / f"c{i}", sock, env=slow_env(30))
               for i in range(2)]
    both = wait_children(zproc, 2)  # both run at once, each in its own child
    assert len({c.pid for c in both}) == 2
    results = [Run(c, tmp_path / f"c{i}", *c.communicate(timeout=300)) for i, c in enumerate(clients)]
    assert [r.code for r in results] == [0, 0], [r.err for r in results]
    outputs = [(r.cwd / "token_ids.json").read_bytes() for r in results]
    assert outputs[0] == outputs[1]


# --- the virtual device's runner wrapper as the zygote's client --------------------------------------

def start_wrapped(argv, cwd: Path, socket_path, real: str, env=None) -> subprocess.Popen:
    """``python -S -m farm.virtual.runwrap --zygote REAL farm-llama-runner ARGS``, as a virtual
    device's /system/bin/farm-llama-runner runs it (no logd here: its lines are best effort)."""
    cwd.mkdir(parents=True, exist_ok=True)
    env = {**procs.farm_env(), **(env or {}), "PTEFARM_RUNNER_ZYGOTE": str(socket_path)}
    return subprocess.Popen([sys.executable, "-S", "-m", "farm.virtual.runwrap", "--zygote", real,
                             "/system/bin/farm-llama-runner", *argv], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_the_wrapper_is_the_zygotes_client_no_second_process(kv, zygote, tmp_path):
    zproc, sock = zygote
    here = run(greedy_argv(kv, "SmartMask"), tmp_path / "in-process")
    # A REAL_RUNNER that does not exist: only the zygote can have run this one.
    wrapper = start_wrapped(greedy_argv(kv, "SmartMask"), tmp_path / "wrapped", sock,
                            str(tmp_path / "no-such-runner"), env=slow_env(30))
    [child] = wait_children(zproc, 1)
    assert psutil.Process(wrapper.pid).children() == []  # the run is the zygote's child, not ours
    out, err = wrapper.communicate(timeout=300)
    assert wrapper.returncode == 0 and here.code == 0, err
    assert ((tmp_path / "wrapped" / "token_ids.json").read_bytes()
            == (tmp_path / "in-process" / "token_ids.json").read_bytes())
    assert not child.is_running()


def test_a_crash_signal_to_the_wrapper_ends_the_zygote_run_and_kills_the_wrapper(kv, zygote, tmp_path):
    """As when the wrapper's client process took the signal: the run ends (the zygote kills a run
    whose client is gone) and the wrapper dies of the same signal, which the device reports as a
    crash (tests/virtual/test_logcat.py)."""
    zproc, sock = zygote
    wrapper = start_wrapped(greedy_argv(kv, "SmartMask"), tmp_path, sock, str(tmp_path / "none"),
                            env=slow_env(500))
    [child] = wait_children(zproc, 1)
    wrapper.send_signal(signal.SIGSEGV)
    _, err = wrapper.communicate(timeout=DEADLINE_S)
    assert wrapper.returncode == -signal.SIGSEGV, err
    _, alive = psutil.wait_procs([child], timeout=DEADLINE_S)
    assert alive == [], "the run outlived the wrapper that was its client"
    assert zproc.poll() is None


def test_the_wrapper_runs_the_real_runner_when_no_zygote_answers(tmp_path):
    real = tmp_path / "real-runner"
    real.write_text("#!/bin/sh\necho \"real: $*\"\nexit 7\n")
    real.chmod(0o755)
    wrapper = start_wrapped(["--seq_len", "8"], tmp_path, tmp_path / "absent.sock", str(real))
    out, err = wrapper.communicate(timeout=DEADLINE_S)
    assert (wrapper.returncode, out) == (7, b"real: --seq_len 8\n"), err


# --- fallback ---------------------------------------------------------------------------------------

def test_falls_back_in_process_when_no_zygote_answers(kv, tmp_path):
    absent = tmp_path / "absent.sock"
    r = run(greedy_argv(kv, "SmartMask"), tmp_path / "absent", absent)
    assert r.code == 0, r.err
    notes = [line for line in r.err.splitlines() if "zygote" in line]
    assert notes == [f"farm-llama-runner: runner zygote {absent} not answering (FileNotFoundError: "
                     "No such file or directory): running in-process"], r.err
    assert "torch" in r.heavy()
    assert json.loads((r.cwd / "token_ids.json").read_text())["generated_ids"]


def test_falls_back_when_the_socket_is_stale(tmp_path):
    stale = tmp_path / "stale.sock"  # a socket file nobody listens on, as a dead zygote leaves
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.bind(str(stale))
    r = run(BAD["iterations"], tmp_path / "run", stale)  # fails in our own argv check: no torch needed
    assert r.code == 2
    assert r.err.splitlines() == [
        f"farm-llama-runner: runner zygote {stale} not answering (ConnectionRefusedError: "
        "Connection refused): running in-process",
        "farm-llama-runner: error: --num_iters: must be at least 1, got 0"]


def test_no_note_when_the_variable_is_unset(tmp_path):
    r = run(BAD["iterations"], tmp_path)
    assert r.code == 2 and r.err == "farm-llama-runner: error: --num_iters: must be at least 1, got 0\n"


# --- the zygote process -----------------------------------------------------------------------------

def test_socket_is_private_and_a_second_zygote_refuses_it(zygote):
    _, sock = zygote
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    second = subprocess.run(zygote_mod.zygote_argv(sock), env=procs.farm_env(), capture_output=True,
                            text=True, timeout=60)
    assert second.returncode == 2
    assert second.stderr == f"farm.runner.zygote: {sock}: in use by a live zygote or not a socket\n"
    assert zygote_mod.wait_ready(sock, timeout=5)  # the first one still serves


def test_wait_ready_gives_up(tmp_path):
    assert zygote_mod.wait_ready(tmp_path / "nobody.sock", timeout=0.2) is False


def serve_in_thread(z: zygote_mod.Zygote) -> threading.Thread:
    z.bind()
    thread = threading.Thread(target=z.serve, daemon=True)
    thread.start()
    return thread


def test_serving_stops_when_the_socket_file_is_removed_or_replaced(tmp_path):
    # The loop alone, in this process: no request comes, so nothing forks and nothing is imported.
    for replace in (False, True):
        path = tmp_path / f"z{int(replace)}.sock"
        z = zygote_mod.Zygote(str(path), owner_pid=None)
        thread = serve_in_thread(z)
        assert zygote_mod.wait_ready(path, timeout=5)
        path.unlink()
        if replace:
            path.write_text("another zygote's socket, say")
        thread.join(DEADLINE_S)
        assert not thread.is_alive()
        z.close()
        assert path.exists() == replace  # close() removes only a socket file that is still its own


def test_a_socket_deeper_than_a_unix_address_still_serves(tmp_path):
    """CI's and pytest's temporary directories easily pass the 107 bytes of sun_path: bind and
    connect then name the socket through the directory's descriptor."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = deep / "z.sock"
    assert len(os.fsencode(str(path))) > zygote_mod.SUN_PATH_MAX
    z = zygote_mod.Zygote(str(path), owner_pid=None)
    thread = serve_in_thread(z)
    assert stat.S_ISSOCK(path.stat().st_mode) and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert zygote_mod.wait_ready(path, timeout=5)
    path.unlink()
    thread.join(DEADLINE_S)
    assert not thread.is_alive()
    z.close()


def test_serving_stops_when_the_owner_is_gone(tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        z = zygote_mod.Zygote(str(tmp_path / "z.sock"), owner_pid=owner.pid)
        thread = serve_in_thread(z)
        time.sleep(zygote_mod.TICK_S * 2)
        assert thread.is_alive()
        owner.kill()
        owner.wait()
        thread.join(DEADLINE_S)
        assert not thread.is_alive()
        z.close()
        assert not (tmp_path / "z.sock").exists()
    finally:
        owner.kill()


def test_concurrent_first_runs_start_one_zygote(tmp_path, monkeypatch):
    """start_detached's marker: of several first runs that find no zygote, one starts it."""
    started = []
    monkeypatch.setattr(subprocess, "Popen", lambda argv, **kw: started.append(argv))
    sock = tmp_path / "z" / "zygote.sock"
    results = [zygote_mod.start_detached(sock) for _ in range(3)]
    assert results == [True, False, False] and len(started) == 1
    assert stat.S_IMODE((tmp_path / "z").stat().st_mode) == 0o700
    marker = Path(str(sock) + zygote_mod.STARTING_SUFFIX)
    os.utime(marker, (time.time() - 600, time.time() - 600))  # a zygote that died while importing
    assert zygote_mod.start_detached(sock) is True and len(started) == 2


def test_a_virtual_device_forks_its_runs_from_a_zygote(virtual_farm, tiny_bundle):
    """The device's first run starts the zygote and waits for it; later runs fork from it, with
    the same tokens, no note on stderr, and the zygote living inside the device's view."""
    from farm.bundle.manifest import load
    from farm.device.discovery import find_device
    from farm.execute.deploy import deploy
    from farm.execute.run import run
    from farm.execute.runprofile import RunRequest
    from farm.virtual import VirtualDeviceSpec
    from farm.virtual.confine import RUNNER_ZYGOTE_SOCKET

    [rec] = virtual_farm.up([VirtualDeviceSpec(soc="SM8650")])
    device = find_device([virtual_farm.adb_server], rec.serial)
    bundle = load(tiny_bundle)
    deploy(device, bundle)
    request = RunRequest(prompts=["Once upon a time"], seq_len=32, temperature=0)
    first = run(device, bundle, request)
    deadline = time.monotonic() + 120
    while device.shell(f"test -S {RUNNER_ZYGOTE_SOCKET}", timeout=10).exit_code != 0:
        assert time.monotonic() < deadline, "no zygote socket in the device after its first run"
        time.sleep(0.2)
    second = run(device, bundle, request)
    assert second.generated_ids == first.generated_ids and first.generated_ids
    assert "not answering" not in (second.stderr or "")
    inside = set(virtual_farm.processes(rec.serial))
    zygotes = [p for p in psutil.process_iter(["cmdline"])
               if "farm.runner.zygote" in " ".join(p.info["cmdline"] or [])]
    assert any(p.pid in inside for p in zygotes), "the zygote runs inside the device's view"


def test_the_zygote_preloads_what_a_run_imports():
    """A run forked from the zygote imports nothing of its own: the tokenizer libraries included
    (pytorch_tokenizers and its backends were 33 modules, ~15 ms, of every run)."""
    code = ("import sys; from farm.runner import zygote; zygote.preload_runner(); "
            "print(' '.join(m for m in ('torch', 'executorch', 'pytorch_tokenizers', 'tiktoken', "
            "'sentencepiece', 'tokenizers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], env=procs.farm_env(), capture_output=True,
                         text=True, check=True, timeout=300)
    assert out.stdout.split() == ["torch", "executorch", "pytorch_tokenizers", "tiktoken",
                                  "sentencepiece", "tokenizers"], out.stderr
    assert "Registering override fallback regex" not in out.stderr  # kept off the zygote's stderr
