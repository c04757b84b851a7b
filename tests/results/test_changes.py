"""Change points over history (farm/results/changes.py, `farm history --changes`): a step is found at
its run, noise and a lone slow run are not changes, a step under the minimum effect is not one, and a
series never mixes measured with simulated figures."""

from __future__ import annotations

import json
import random
import re

import pytest
from click.testing import CliRunner

from farm.cli.main import main
from farm.results.changes import PointSeries, RunPoint, find_changes
from farm.results.store import ResultsStore
from tests.support.results import make_run


def _series(levels: list[float], *, sigma: float = 0.01, seed: int = 0) -> PointSeries:
    rng = random.Random(seed)
    runs = [RunPoint(f"r{i:03d}", float(i), tuple(level * (1 + rng.gauss(0, sigma)) for _ in range(5)))
            for i, level in enumerate(levels)]
    return PointSeries("SM8650", "tok_s", "kv", 64, "SmartMask", "tok/s", "measured", runs)


def test_a_step_is_found_at_its_run():
    (change,) = find_changes(_series([40.0] * 15 + [38.0] * 15))
    assert change.index == 15 and change.run_id == "r015"
    assert change.delta == pytest.approx(-0.05, abs=0.01) and change.p_value < 0.01


def test_two_steps_are_two_changes():
    found = find_changes(_series([40.0] * 10 + [36.0] * 10 + [40.0] * 10))
    assert [c.index for c in found] == [10, 20]
    assert found[0].delta < 0 < found[1].delta


@pytest.mark.parametrize("seed", range(10))
def test_noise_alone_is_no_change(seed):
    assert find_changes(_series([40.0] * 40, sigma=0.02, seed=seed)) == []


def test_a_lone_slow_run_is_no_change():
    assert find_changes(_series([40.0] * 12 + [30.0] + [40.0] * 12)) == []


def test_a_step_under_the_minimum_effect_is_no_change():
    series = _series([40.0] * 15 + [39.4] * 15, sigma=0.002)
    assert find_changes(series, min_effect=0.03) == []
    assert [c.index for c in find_changes(series, min_effect=0.01)] == [15]


def test_history_changes_from_the_store(tmp_path):
    url = f"sqlite:///{tmp_path / 'pool.db'}"
    rng = random.Random(1)
    with ResultsStore.open(url) as store:
        for i in range(24):
            level = 40.0 if i < 12 else 37.0
            run = make_run(f"2025010{1 + i // 10}-{i:06d}", started_at=f"2025-01-{1 + i:02d}T00:00:00+0000",
                           tok_s=tuple(level * (1 + rng.gauss(0, 0.005)) for _ in range(5)))
            if i >= 20:  # the last runs are on simulated phones: a series of their own
                for r in run.records:
                    for m in r.measurements:
                        m.timing = "simulated"
            store.save_run(run)
    plots = tmp_path / "trends"
    result = CliRunner().invoke(main, ["history", "--changes", "--json", "--url", url, "--plot", str(plots)])
    assert result.exit_code == 0, result.output
    points = {p["point"]: p for p in json.loads(result.output)["points"]}
    measured = points["SM8650 kv/64/SmartMask tok_s (host-cpu)"]
    assert measured["runs"] == 20
    (change,) = measured["changes"]
    assert change["run_id"].endswith("000012") and change["delta"] == pytest.approx(-0.075, abs=0.01)
    assert points["SM8650 kv/64/SmartMask tok_s (simulated)"]["runs"] == 4
    assert (plots / "index.html").exists() and "SIMULATED" in (plots / "index.html").read_text()
    text = CliRunner().invoke(main, ["history", "--changes", "--url", url])
    assert text.exit_code == 0 and "-7." in text.output
    bad = CliRunner().invoke(main, ["history", "--plot", str(plots), "--url", url])
    assert bad.exit_code == 2 and "only with --changes" in bad.output


def test_the_nightly_report_draws_each_points_trend_with_its_change_points(tmp_path):
    """farm qualify's report of a nightly run (write_outputs with history_of): a "Trends over
    history" section, one SVG per point, the change point named by its run; a store that cannot be
    read costs the report nothing but the section."""
    from farm.cli.report import history_of, write_outputs

    url = f"sqlite:///{tmp_path / 'pool.db'}"
    (tmp_path / "farm.toml").write_text(f'[pool]\nurl = "{url}"\n')
    rng = random.Random(2)
    with ResultsStore.open(url) as store:
        for i in range(16):
            level = 40.0 if i < 8 else 36.0
            run = make_run(f"20250101-{i:06d}", started_at=f"2025-01-{1 + i:02d}T00:00:00+0000",
                           tok_s=tuple(level * (1 + rng.gauss(0, 0.005)) for _ in range(5)))
            store.save_run(run)
    history = history_of(run, config_path=str(tmp_path / "farm.toml"))
    assert history is not None and history[0] == "the last 16 nightly run(s) of stories_110m"
    written = write_outputs(run, None, tmp_path / "report", ("markdown", "html"), history=history)
    page = written.paths["html"].read_text()
    assert "<h2>Trends over history</h2>" in page and page.count("<svg") >= 3  # the run's plots too
    assert re.search(r"run 20250101-000008: 39\.\d -&gt; 35\.\d \(-10\.\d%", page)
    assert "run 20250101-000008: -10.0%" in written.markdown
    (tmp_path / "bad.toml").write_text('[pool]\nurl = "postgresql://nobody@127.0.0.1:1/none"\n')
    assert history_of(run, config_path=str(tmp_path / "bad.toml")) is None
    assert history_of(make_run(purpose="pr"), config_path=str(tmp_path / "farm.toml")) is None
