"""One exit-code table (farm/exitcodes.py) for every command: each code, command by command."""

from __future__ import annotations

import json
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from farm.bundle.manifest import load
from farm.cli.main import main
from farm.exitcodes import ExitCode, for_error, for_verdict
from farm.pool import Holder, LeaseRequest, Pool
from farm.virtual import VirtualDeviceSpec, VirtualFarm
from farm.vocab import Verdict
from tests.support.devices import make_qnn_bundle
from tests.support.pool import fake_device


@dataclass
class World:
    root: Path
    config: Path  # the virtual farm's adb server; the pool does not know its device
    pool_url: str
    serial: str
    qnn: Path  # fake qnn-v1.0 bundle whose manifest gives a context of 128
    host: Path  # the reference bundle (host runner), its manifest without the context
    dead_config: Path  # an adb server nobody listens on


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_bundle) -> World:
    root = tmp_path_factory.mktemp("exit-codes")
    qnn = make_qnn_bundle(root / "qnn", name="ctx128")
    bundle = load(qnn)
    bundle.model = {"max_seq_len": 128}
    bundle.write(qnn)
    host_dir = root / "host"
    shutil.copytree(Path(tiny_bundle).parent, host_dir)
    raw = json.loads((host_dir / Path(tiny_bundle).name).read_text())
    raw["model"] = {k: v for k, v in raw["model"].items()
                    if k not in ("max_seq_len", "max_context_len", "context_len")}
    host = host_dir / "manifest.json"
    host.write_text(json.dumps(raw))
    pool_url = f"sqlite:///{root / 'pool.db'}"
    with Pool.open(pool_url) as p:
        p.sync([fake_device("dev0")])
        p.acquire(LeaseRequest(serial="dev0"), Holder("other", "h", 1), ttl_s=3600, timeout_s=5)
    with VirtualFarm(home=root / "farm") as vf:
        (record,) = vf.up([VirtualDeviceSpec(soc="SM8650")])
        config = root / "farm.toml"
        config.write_text(f'[farm]\nhome = "{root / "home"}"\n\n'
                          f'[[adb_servers]]\nhost = "{vf.adb_server.host}"\nport = {vf.adb_server.port}\n')
        dead = root / "dead.toml"
        dead.write_text(f'[farm]\nhome = "{root / "home"}"\n\n[[adb_servers]]\nport = {_dead_port()}\n')
        yield World(root, config, pool_url, record.serial, qnn, host, dead)


def _interrupt(monkeypatch):
    def status(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(Pool, "status", status)


def _throughput_run(out: Path, tok_s: float) -> Path:
    """A report directory of one passed throughput test with six samples around ``tok_s``."""
    from farm.report.directory import write_reports
    from farm.results.records import Measurement, TestRecord
    from farm.vocab import Outcome

    samples = [tok_s + d for d in (-0.3, -0.2, -0.1, 0.1, 0.2, 0.3)]
    record = TestRecord("suites/test_throughput.py::test_min_throughput[SM8650-kv-64-SmartMask]",
                        Outcome.PASSED, soc="SM8650", serial="dev0",
                        measurements=[Measurement("tok_s", "tok/s", samples, "SmartMask", "kv", 64)])
    meta = {"run_id": out.name, "bundle_name": "b", "bundle_digest": "ab" * 32, "virtual": True}
    return write_reports([record], out, meta)


Row = tuple[str, ExitCode, Callable[[World], list[str]], Callable | None]

ROWS: list[Row] = [
    ("pool-status", ExitCode.OK, lambda w: ["pool", "status", "--url", w.pool_url], None),
    ("run", ExitCode.OK,
     lambda w: ["run", str(w.qnn), "--serial", w.serial, "--prompt", "hi", "--config", str(w.config)], None),
    ("run-runner-fails", ExitCode.TEST_FAILURE,
     lambda w: ["run", str(w.qnn), "--serial", w.serial, "--prompt", "FAIL", "--config", str(w.config)],
     None),
    ("deploy-missing-manifest", ExitCode.BAD_INPUT,
     lambda w: ["deploy", str(w.root / "missing.json"), "--serial", w.serial, "--config", str(w.config)],
     None),
    ("run-seq-len-past-context", ExitCode.BAD_INPUT,
     lambda w: ["run", str(w.qnn), "--serial", w.serial, "--prompt", "hi", "--seq-len", "1000",
                "--config", str(w.config)], None),
    ("run-host-runner-bad-input", ExitCode.BAD_INPUT,
     lambda w: ["run", str(w.host), "--serial", w.serial, "--prompt", "hi", "--seq-len", "4",
                "--config", str(w.config)], None),
    ("pool-release-unknown-token", ExitCode.BAD_INPUT,
     lambda w: ["pool", "release", "0" * 32, "--url", w.pool_url], None),
    ("pool-exec-lease-timeout", ExitCode.INFRA,
     lambda w: ["pool", "exec", "--url", w.pool_url, "--serial", "dev0", "--timeout", "0", "--", "true"],
     None),
    ("pool-lease-timeout", ExitCode.INFRA,
     lambda w: ["pool", "lease", "--serial", "dev0", "--timeout", "0", "--url", w.pool_url], None),
    ("devices-server-unreachable", ExitCode.INFRA,
     lambda w: ["devices", "--config", str(w.dead_config)], None),
    ("deploy-server-unreachable", ExitCode.INFRA,
     lambda w: ["deploy", str(w.qnn), "--serial", "x", "--config", str(w.dead_config)], None),
    ("report-regressed", ExitCode.REGRESSION,
     lambda w: ["report", str(_throughput_run(w.root / "now", 30.0)), "--compare",
                str(_throughput_run(w.root / "base", 40.0)), "--out", str(w.root / "report")], None),
    ("pool-status-interrupted", ExitCode.INTERRUPTED,
     lambda w: ["pool", "status", "--url", w.pool_url], _interrupt),
]

EXPECTED = {  # the reason, where another path could give the same code
    "run-seq-len-past-context": "--seq-len: 1000 exceeds the context of bundle 'ctx128' (128 tokens, "
                                "manifest field model.max_seq_len) [UsageError]",
    "run-host-runner-bad-input": "the runner refused the request: farm-llama-runner: error: --seq_len: "
                                 "sequence length exceeded - please increase the seq_len value",
    "pool-status-interrupted": "farm: interrupted",
}


@pytest.mark.parametrize("name, code, args, patch", ROWS, ids=[r[0] for r in ROWS])
def test_every_command_exits_with_the_table(world, monkeypatch, name, code, args, patch):
    if patch is not None:
        patch(monkeypatch)
    result = CliRunner().invoke(main, args(world), env={"PTEFARM_LEASE": None, "ANDROID_SERIAL": None,
                                                        "PTEFARM_CONFIG": None})
    assert result.exit_code == code, (name, result.output, result.exception)
    if name in EXPECTED:
        assert EXPECTED[name] in result.stderr, result.stderr
    if code != ExitCode.OK:
        assert "Traceback" not in result.output
        assert "farm: " in result.stderr  # one line of ours says why


def test_the_table_is_covered_and_shared():
    assert {code for _, code, _, _ in ROWS} == set(ExitCode)
    assert [int(c) for c in ExitCode] == [0, 1, 2, 3, 4, 130]
    assert {v: for_verdict(v) for v in Verdict} == {
        Verdict.PASS: ExitCode.OK, Verdict.FAIL: ExitCode.TEST_FAILURE,
        Verdict.BAD_INPUT: ExitCode.BAD_INPUT, Verdict.INFRA_ERROR: ExitCode.INFRA}
    from farm.errors import AdbServerDown, LeaseError, UsageError
    from farm.execute.run import RunnerFailed

    assert for_error(UsageError("x")) == for_error(LeaseError("x")) == ExitCode.BAD_INPUT
    assert for_error(AdbServerDown("x")) == ExitCode.INFRA
    assert for_error(RunnerFailed("x", None)) == ExitCode.TEST_FAILURE
    assert for_error(KeyboardInterrupt()) == ExitCode.INTERRUPTED
