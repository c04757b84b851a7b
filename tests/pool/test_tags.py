"""Tags: set with ``farm pool tag`` (kept until removed), given by the config's ``[[devices]]`` (applied
on every sync that knows the config), and matched by lease requests."""

from __future__ import annotations

import pytest

from farm.config import from_dict, load_config
from farm.errors import UsageError
from farm.pool import LeaseRequest, Pool
from tests.support.pool import fake_device


def _serial(pool, *tags: str) -> str:
    lease = pool.acquire(LeaseRequest(tags=tags), ttl_s=30, timeout_s=1)
    pool.release(lease.token)
    return lease.serial


def test_tags_set_by_hand_match_requests_and_survive_syncs(pool):
    pool.sync([fake_device("dev0"), fake_device("dev1", tags=("usb3",))])
    device = pool.tag("dev0", ["flagship", "lab-2"])
    assert device.tags == ("flagship", "lab-2")
    pool.sync([fake_device("dev0"), fake_device("dev1", tags=("usb3",))])  # discovery has none
    assert _serial(pool, "flagship") == "dev0" and _serial(pool, "usb3") == "dev1"
    assert pool.tag("dev1", ["flagship"]).tags == ("flagship", "usb3")  # discovery's and ours
    assert pool.tag("dev0", ["flagship"], remove=True).tags == ("lab-2",)
    assert _serial(pool, "flagship") == "dev1"
    kinds = [e.kind for e in pool.history(serial="dev0")]
    assert kinds.count("tagged") == 1 and kinds.count("untagged") == 1


def test_bad_tag_requests_are_usage_errors(pool):
    pool.sync([fake_device("dev0", tags=("usb3",))])
    with pytest.raises(UsageError, match="not in the pool"):
        pool.tag("nosuch", ["x"])
    with pytest.raises(UsageError, match="must be 1-64 characters"):
        pool.tag("dev0", ["has space"])
    with pytest.raises(UsageError, match="reported by discovery"):
        pool.tag("dev0", ["usb3"], remove=True)
    with pytest.raises(UsageError, match="has no tag 'x'"):
        pool.tag("dev0", ["x"], remove=True)


def test_config_tags_are_applied_on_sync(pool_url):
    with Pool.open(pool_url, device_tags={"phone1": ["flagship"]}) as pool:
        pool.sync([fake_device("phone1", virtual=False), fake_device("phone2", virtual=False)])
        assert _serial(pool, "flagship") == "phone1"
        with pytest.raises(UsageError, match="comes from the farm config"):
            pool.tag("phone1", ["flagship"], remove=True)
    with Pool.open(pool_url) as pool:  # a sync that does not know the config leaves them alone
        pool.sync([fake_device("phone1", virtual=False)])
        assert _serial(pool, "flagship") == "phone1"
    with Pool.open(pool_url, device_tags={"phone2": ["flagship", "usb3"]}) as pool:
        pool.sync([fake_device("phone1", virtual=False), fake_device("phone2", virtual=False)])
        assert _serial(pool, "flagship") == "phone2"  # the config moved the tag
        assert _serial(pool, "usb3") == "phone2"
        devices = {d.device.serial: d.device.tags for d in pool.status().devices}
        assert devices == {"phone1": (), "phone2": ("flagship", "usb3")}


def test_the_config_names_devices_and_their_tags(pool_url, tmp_path):
    path = tmp_path / "farm.toml"
    path.write_text(f'[pool]\nurl = "{pool_url}"\n\n[[devices]]\nserial = "R5CW1"\n'
                    f'tags = ["flagship", "usb3"]\n\n[[devices]]\nserial = "R5CW2"\n')
    config = load_config(path)
    assert config.device_tags == {"R5CW1": ("flagship", "usb3")}
    with Pool.from_config(config) as pool:
        pool.sync([fake_device("R5CW1", virtual=False), fake_device("R5CW2", virtual=False)])
        assert _serial(pool, "flagship", "usb3") == "R5CW1"


def test_pool_settings_have_defaults():
    config = from_dict({})
    assert config.pool.liveness_s == 120 and config.pool.retention_days == 30
    assert config.devices == ()


@pytest.fixture
def cli(pool_cli):
    return pool_cli


def test_farm_pool_tag(cli, pool_url):
    with Pool.open(pool_url) as pool:
        pool.sync([fake_device("dev0"), fake_device("dev1")])
    assert cli("tag", "dev0", "flagship", "usb3") == (0, "dev0: tags flagship, usb3\n", "")
    code, out, _ = cli("lease", "--tag", "flagship", "--timeout", "0", "--format", "json")
    assert code == 0 and '"serial": "dev0"' in out
    assert cli("tag", "dev0", "usb3", "--remove") == (0, "dev0: tags flagship\n", "")
    code, _, err = cli("tag", "nosuch", "x")
    assert code == 2 and "nosuch" in err
    code, _, err = cli("lease", "--tag", "usb3", "--timeout", "30")
    assert code == 2 and "unknown tag(s) usb3" in err
