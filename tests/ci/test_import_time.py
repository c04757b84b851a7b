"""What every farm process pays at start: the CLI, the pytest plugin (every xdist worker) and the
runner's client import nothing heavy. Judged by which modules are loaded, never by a clock."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

# Each costs 0.5 s or more of CPU to import on the 2-core CI machine; the farm imports them where used.
HEAVY = ("torch", "executorch", "scipy", "matplotlib", "numpy", "transformers", "lm_eval")


def loaded_after(module: str) -> set[str]:
    code = f"import sys, {module}; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


# farm.runner.main is what `farm-llama-runner` imports before handing the run to the zygote;
# farm.virtual.runwrap is a virtual device's runner wrapper, the zygote's client itself
@pytest.mark.parametrize("module", ["farm.cli.main", "ptefarm_fixtures.plugin", "farm.runner.main",
                                    "farm.virtual.runwrap"])
def test_start_up_imports_nothing_heavy(module):
    assert not loaded_after(module) & set(HEAVY)


# Every xdist worker of a qualification collects the suites: scipy.stats alone was ~0.7 s of CPU
# for each (farm.results.ab took a normal quantile from it; the standard library has it).
@pytest.mark.parametrize("module", ["suites.test_correctness", "suites.test_throughput",
                                    "suites.test_smoke", "suites.test_multimodal"])
def test_the_suites_import_nothing_heavy_but_numpy(module):
    assert not loaded_after(module) & (set(HEAVY) - {"numpy"})


def test_requests_finds_a_chardet_that_imports_fast():
    # requests (through adbutils) imports chardet whenever it is installed; lm-eval's table writers
    # install it. 6.0 carries language models that take 2.2 s to import; 5.x 0.24 s.
    try:
        version = importlib.metadata.version("chardet")
    except importlib.metadata.PackageNotFoundError:
        return  # requests takes charset_normalizer
    assert int(version.split(".")[0]) < 6, f"chardet {version}: pin chardet==5.2.0 (pyproject.toml)"
