"""The farm's own adb server: isolated port and HOME, idempotent start, clean stop, clear errors."""

from __future__ import annotations

import os

import pytest

from farm import procs
from farm.device.adb_server import AdbServer
from farm.errors import AdbError
from farm.virtual.manager import free_port


@pytest.fixture
def server(tmp_path):
    s = AdbServer(port=free_port(), home=tmp_path / "adb-home")
    yield s
    s.stop()


def test_start_is_isolated_and_idempotent(server, tmp_path):
    assert not server.is_running()
    assert server.start() is True
    assert server.is_running()
    # its key lives in its own HOME, not the user's ~/.android
    assert (tmp_path / "adb-home" / ".android" / "adbkey").exists()
    assert server.start() is False  # already answering: reused, not restarted
    assert server.devices() == {}


def test_stop_ends_the_process(server):
    server.start()
    pid = int((server.home / "server.pid").read_text())
    server.stop()
    assert not server.is_running()
    assert not procs.is_ours(pid, server.owned())
    server.stop()  # stopping a stopped server is fine


def test_start_after_stale_pid_file(server):
    server.home.mkdir(parents=True)
    (server.home / "server.pid").write_text(str(os.getpid()))  # a live pid that is not adb
    assert server.start() is True
    assert server.is_running()
    assert os.getpid() != int((server.home / "server.pid").read_text())


def test_listen_all_server(tmp_path):
    s = AdbServer(port=free_port(), home=tmp_path / "adb-all", listen_all=True)
    try:
        s.start()
        assert s.client().server_version() > 0
    finally:
        s.stop()
    assert not s.is_running()


def test_connect_to_nothing_raises_adb_error(server):
    server.start()
    with pytest.raises(AdbError, match="127.0.0.1:1"):
        server.connect("127.0.0.1:1", timeout=5)


def test_wait_for_absent_device_names_it(server):
    server.start()
    with pytest.raises(AdbError, match="127.0.0.1:9 is absent"):
        server.wait_for_state("127.0.0.1:9", "device", timeout=0.3)


def test_port_in_use_by_something_else(tmp_path):
    import socket
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen(1)
        s = AdbServer(port=blocker.getsockname()[1], home=tmp_path / "adb-busy")
        with pytest.raises(AdbError, match="in use by something that is not an adb server"):
            s.start(timeout=5)
        s.stop()
