"""ci/start-postgres.sh: its decisions, driven through stand-in PostgreSQL tools on PATH (the real
server of this machine is never stopped), plus one run against whatever server is really there."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.pool import REPO, pg_base_url

SCRIPT = REPO / "ci" / "start-postgres.sh"

# Each stand-in logs its arguments; pg_isready answers once the fake cluster was started.
FAKES = {
    "pg_isready": '[ -e "$STATE/started" ]',
    "pg_ctlcluster": 'echo "pg_ctlcluster $*" >> "$STATE/log"; '
                     '[ -e "$STATE/ctl-fails" ] && exit 1; touch "$STATE/started"',
    "psql": 'echo "psql $*" >> "$STATE/log"; '
            'case "$*" in *pg_database*) [ -e "$STATE/db" ] && echo 1;; '
            '*"CREATE DATABASE"*) touch "$STATE/db";; esac; exit 0',
    "apt-get": 'echo "apt-get $*" >> "$STATE/log"; '
               '[ "$1" = install ] && mkdir -p "$PTEFARM_PG_ETC/15/main" '
               '&& echo "host all all 127.0.0.1/32 scram-sha-256" > "$PTEFARM_PG_ETC/15/main/pg_hba.conf"; '
               'exit 0',
    "runuser": 'shift 2; exec "$@"',
    "sudo": 'exec "$@"',
}


@pytest.fixture
def fake_tools(tmp_path: Path) -> dict[str, str]:
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    for name, body in FAKES.items():
        tool = bin_dir / name
        tool.write_text(f"#!/bin/sh\n{body}\n")
        tool.chmod(0o755)
    etc = tmp_path / "etc-postgresql"
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STATE": str(state),
            "PTEFARM_PG_ETC": str(etc), "PTEFARM_TEST_PG_URL": "postgresql://postgres@127.0.0.1/test"}


def run(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120,
                          check=False)


def log(env: dict[str, str]) -> list[str]:
    path = Path(env["STATE"]) / "log"
    return path.read_text().splitlines() if path.exists() else []


def test_stopped_cluster_is_started_and_test_db_created(fake_tools):
    (Path(fake_tools["PTEFARM_PG_ETC"]) / "15" / "main").mkdir(parents=True)
    result = run(fake_tools)
    assert result.returncode == 0, result.stderr
    lines = log(fake_tools)
    assert "pg_ctlcluster --skip-systemctl-redirect 15 main start" in lines
    assert any("CREATE DATABASE test" in line for line in lines)
    assert not any(line.startswith("apt-get") for line in lines)


def test_running_server_is_left_alone(fake_tools):
    (Path(fake_tools["STATE"]) / "started").touch()
    (Path(fake_tools["STATE"]) / "db").touch()
    result = run(fake_tools)
    assert result.returncode == 0, result.stderr
    assert "answers on 127.0.0.1:5432" in result.stderr
    lines = log(fake_tools)
    assert not any(line.startswith(("pg_ctlcluster", "apt-get")) for line in lines)
    assert not any("CREATE DATABASE" in line for line in lines)


def test_missing_postgres_is_installed(fake_tools):
    result = run(fake_tools)
    assert result.returncode == 0, result.stderr
    lines = log(fake_tools)
    assert any(line.startswith("apt-get install -y -q postgresql") for line in lines)
    assert "pg_ctlcluster --skip-systemctl-redirect 15 main start" in lines
    hba = Path(fake_tools["PTEFARM_PG_ETC"]) / "15" / "main" / "pg_hba.conf"
    assert "host all all 127.0.0.1/32 trust" in hba.read_text()


def test_failure_to_start_is_a_clear_error(fake_tools):
    (Path(fake_tools["PTEFARM_PG_ETC"]) / "15" / "main").mkdir(parents=True)
    (Path(fake_tools["STATE"]) / "ctl-fails").touch()
    result = run(fake_tools)
    assert result.returncode != 0
    assert "pg_ctlcluster 15 main start failed" in result.stderr


def test_disabled_by_empty_url(fake_tools):
    result = run({**fake_tools, "PTEFARM_TEST_PG_URL": ""})
    assert result.returncode == 0 and "disabled" in result.stderr
    assert log(fake_tools) == []


@pytest.mark.postgres
def test_real_server_answers_after_the_script():
    if pg_base_url() is None:
        pytest.skip("PTEFARM_TEST_PG_URL is empty: PostgreSQL tests disabled")
    result = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=300,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert "ready: postgresql://postgres@127.0.0.1:5432/test" in result.stderr
