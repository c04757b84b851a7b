"""A user's own device test, using the ptefarm plugin's fixtures (README, "Your own tests").

    pytest examples/test_my_bundle.py --farm-virtual SM8650            # on a virtual device
    pytest examples/test_my_bundle.py --farm-config farm.toml --farm-bundle path/to/manifest.json

Each test runs once per SoC of the pool (test_story_is_greedy[SM8650]); @pytest.mark.soc narrows it.
"""

import pytest


def test_story_is_greedy(llm):
    """At temperature 0 the same request gives the same tokens twice on one device."""
    first = llm.generate("Once upon a time", mode="kv", seq_len=32)
    again = llm.generate("Once upon a time", mode="kv", seq_len=32)
    assert first.text and first.text == again.text


@pytest.mark.soc("SM8650")
@pytest.mark.parametrize("updater", ["SmartMask", "ShiftPointer"])
def test_each_updater_generates(llm, updater):
    if updater not in llm.updaters:
        pytest.skip(f"this bundle's runner has no {updater}")
    result = llm.generate("Hello", updater=updater, seq_len=40)
    assert result.tokens_per_s and result.tokens_per_s > 0


def test_device_identity(device):
    """The leased device is the SoC the test was parametrized with."""
    model = device.shell("getprop ro.soc.model").out.strip()
    assert model == device.soc
