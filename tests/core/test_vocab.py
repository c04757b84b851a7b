"""The vocabulary (farm.vocab) and the tables derived from it elsewhere."""

from __future__ import annotations

import json

import pytest

from farm.vocab import EVAL_MODE_NUMBERS, DeviceState, Dialect, EvalMode, Outcome, Updater


def test_members_are_their_strings():
    assert Updater.SMART_MASK == "SmartMask" and f"{Updater.SHIFT_POINTER}" == "ShiftPointer"
    assert json.dumps([Dialect.QNN_V1_0, DeviceState.LEASED]) == '["qnn-v1.0", "leased"]'
    assert {"kv": 1}[EvalMode.KV] == 1  # a plain string key finds the member and back
    assert Updater("ShiftPointer") is Updater.SHIFT_POINTER


def test_eval_mode_table_both_ways():
    assert [(m.value, m.number) for m in EvalMode] == [("kv", 0), ("hybrid", 1), ("lookahead", 2)]
    for mode, number in EVAL_MODE_NUMBERS.items():
        assert EvalMode.from_number(number) is mode
    assert EvalMode.from_number(7) is None


def test_dialect_updaters():
    assert Dialect.HOST.updaters == Dialect.QNN_V1_0.updaters == (Updater.SMART_MASK,
                                                                   Updater.SHIFT_POINTER)
    assert Dialect.QNN_V1_4.updaters == (Updater.SMART_MASK,)


def test_old_names_still_importable_and_derived():
    from farm.bundle import manifest as bundle
    from farm.bundle import qnn as qnn_bundle
    from farm.execute import compare, runprofile
    from farm.pool import AVAILABLE, LEASED, OFFLINE, QUARANTINED
    from farm.results import records as results
    from farm.runner import engine, io_manager

    assert results.Outcome is Outcome
    assert (AVAILABLE, LEASED, QUARANTINED, OFFLINE) == tuple(DeviceState)
    assert runprofile.UPDATERS == compare.UPDATER_PAIR == tuple(Updater)
    assert runprofile.DIALECT_UPDATERS == {d: d.updaters for d in Dialect}
    assert runprofile.DIALECT_UPDATERS["qnn-v1.4"] == ("SmartMask",)
    assert bundle.DIALECTS == tuple(Dialect)
    assert set(io_manager.UPDATERS) == set(Updater)
    assert all(cls.name == name for name, cls in io_manager.UPDATERS.items())
    assert qnn_bundle.EVAL_MODES == {"kv": 0, "hybrid": 1, "lookahead": 2}
    assert set(engine.METHODS) == {mode.number for mode in EvalMode}  # kv, hybrid, lookahead


def test_virtual_status_is_not_the_pool_status():
    import farm.pool
    import farm.virtual

    assert not hasattr(farm.virtual, "DeviceStatus")
    assert farm.virtual.VirtualDeviceStatus is not farm.pool.DeviceStatus


@pytest.mark.parametrize("dialect", list(Dialect))
def test_runprofile_refuses_updaters_a_dialect_lacks(dialect, tmp_path):
    from farm.bundle.manifest import Bundle, Mode
    from farm.errors import UsageError
    from farm.execute.runprofile import RunRequest, runner_argv

    bundle = Bundle(name="b", runner_dialect=dialect.value, tokenizer="t", files=[],
                    modes={"kv": Mode(pte="kv.pte", eval_mode=0, ar_len=1)},
                    runner=None if dialect == Dialect.HOST else "qnn_llama_runner",
                    manifest_path=tmp_path / "manifest.json")
    for updater in Updater:
        request = RunRequest(prompts=["hi"], updater=updater)
        if updater in dialect.updaters:
            argv, _ = runner_argv(bundle, request, "runs/x")
            assert ("--kv_updater" in argv) == (dialect != Dialect.QNN_V1_4)
        else:
            with pytest.raises(UsageError, match=f"'{dialect}' supports only the SmartMask updater"):
                runner_argv(bundle, request, "runs/x")


def test_every_event_the_pool_logs_is_an_event_kind(tmp_path):
    """The pool's code names each kind it logs through EventKind (no string of its own), and what a
    pool's life writes reads back as EventKind members."""
    import ast
    from pathlib import Path

    import farm.pool
    from farm.pool import Pool
    from farm.vocab import EventKind
    from tests.support.pool import fake_device

    for path in Path(farm.pool.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("log_event", "end_lease"):
                kind = node.args[1] if node.func.id == "log_event" else node.args[2]
                assert not isinstance(kind, ast.Constant), f"{path.name}:{node.lineno}: kind {kind.value!r}"
    with Pool.open(f"sqlite:///{tmp_path / 'pool.db'}") as pool:
        pool.sync([fake_device("A"), fake_device("B")])
        lease = pool.acquire()
        pool.release(lease.token)
        pool.tag("A", ["x"])
        pool.quarantine("B", "test")
        pool.restore("B")
        pool.sync([fake_device("A")])
        logged = {e.kind for e in pool.history(limit=None)}
    assert logged <= set(EventKind), logged - set(EventKind)
    assert {EventKind.ADDED, EventKind.LEASED, EventKind.RELEASED, EventKind.QUARANTINED,
            EventKind.RESTORED, EventKind.OFFLINE, EventKind.TAGGED} <= logged


def test_infra_event_names():
    from farm.vocab import PURPOSES, EventKind, Purpose

    assert {k.infra_name for k in EventKind if k.infra_name} == {
        "quarantine", "offline", "release-lost", "infra-failure", "online", "restored", "recovery"}
    assert EventKind.LEASED.infra_name is None
    assert PURPOSES == ("pr", "nightly", "release", "adhoc") == tuple(Purpose)
