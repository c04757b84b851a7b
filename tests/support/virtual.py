"""Fixtures: virtual Snapdragon devices behind a real adb server of the test's own.

- ``virtual_farm``: a fresh VirtualFarm (nothing started yet) in tmp_path with its own adb server port;
  call ``.up([...])`` in the test. Everything it started is stopped at teardown.
- ``virtual_cli_env``: ``(env, home, port)`` for running ``farm virtual ...`` as a user would: a farm.toml
  (in ``env`` as PTEFARM_CONFIG) naming a home and a free adb server port; whatever a test left up is
  brought down at teardown.
- ``shared_virtual_farm``: one per session with an SM8650 and a platform-only SM8550 device, for tests
  that do not change a device's state (no faults, no kill, no restart).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from farm.virtual import VirtualDeviceSpec, VirtualFarm


@pytest.fixture
def virtual_farm(tmp_path) -> Iterator[VirtualFarm]:
    with VirtualFarm(home=tmp_path / "farm") as vf:
        yield vf


@pytest.fixture
def virtual_cli_env(tmp_path):
    from farm.virtual.manager import free_port

    home = tmp_path / "home"
    port = free_port()
    config = tmp_path / "farm.toml"
    config.write_text(f'[farm]\nhome = "{home}"\n\n[[adb_servers]]\nport = {port}\n')
    yield {"PTEFARM_CONFIG": str(config)}, home, port
    VirtualFarm(home=home, adb_port=port).down()  # whatever a failed test left


@pytest.fixture(scope="session")
def shared_virtual_farm(tmp_path_factory) -> Iterator[VirtualFarm]:
    with VirtualFarm(home=tmp_path_factory.mktemp("shared-virtual-farm")) as vf:
        vf.up([VirtualDeviceSpec(soc="SM8650"), VirtualDeviceSpec(soc="SM8550", platform_only=True)])
        yield vf


# Files of this size and more go as chunks when a test runs in the "chunked" deploy mode: the
# reference programs (~750 KB) and the test bundles' .pte files (300-400 KB) all do.
CHUNKED_FROM_BYTES = 64 * 1024


@pytest.fixture(scope="module", params=["plain", "chunked"])
def deploy_mode(request):
    """Run a module's tests once with whole-file pushes and once with chunked deploy on (through the
    environment, so a farm command a test starts deploys the same way). Module-scoped, so that a
    module's shared virtual devices (which take it as an argument) are made anew for each mode:
    a workspace the other mode deployed is not this mode's."""
    from farm.execute.chunking import MIN_BYTES_ENV

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(MIN_BYTES_ENV, "off" if request.param == "plain" else str(CHUNKED_FROM_BYTES))
        yield request.param
