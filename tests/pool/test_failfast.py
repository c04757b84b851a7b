"""Fail fast: a request no device of the pool could ever serve is bad input, refused at once with what
the pool has (and the nearest SoC name for a typo); one that could be served some day waits."""

from __future__ import annotations

import time

import pytest

from farm.errors import LeaseTimeout, UsageError
from farm.pool import LeaseRequest
from tests.support.pool import PROMPT_S, fake_device


@pytest.fixture
def lab(pool):
    pool.sync([fake_device("a8650", "SM8650", "v75", tags=("flagship",)),
               fake_device("b8650", "SM8650", "v75"),
               fake_device("c8550", "SM8550", "v73", virtual=False)])
    return pool


def _refused(pool, **request) -> str:
    started = time.monotonic()
    with pytest.raises(UsageError) as err:
        pool.acquire(LeaseRequest(**request), ttl_s=30, timeout_s=PROMPT_S)
    assert time.monotonic() - started < 5, "refused at once, not after the timeout"
    assert not pool.status().queue  # it never joined the queue
    return str(err.value)


def test_a_misspelt_soc_is_refused_with_the_nearest_name(lab):
    message = _refused(lab, socs=["SM865O"])
    assert "unknown SoC 'SM865O'" in message and "did you mean SM8650" in message
    assert "SoC SM8550 (1), SM8650 (2)" in message and "HTP v73, v75" in message


def test_a_known_soc_the_pool_lacks_is_refused_with_the_list(lab):
    message = _refused(lab, socs=["SM8750"])
    assert "no device of SoC SM8750" in message and "3 device(s)" in message
    assert "did you mean" not in message


def test_an_unknown_tag_is_refused(lab):
    message = _refused(lab, socs=["SM8650"], tags=["usb3"])
    assert "unknown tag(s) usb3" in message and "tags flagship (1)" in message


def test_a_combination_no_single_device_has_is_refused(lab):
    message = _refused(lab, socs=["SM8550"], tags=["flagship"])
    assert "no single device has all of it" in message


def test_an_htp_arch_above_every_device_is_refused(lab):
    message = _refused(lab, min_htp_arch="v79")
    assert "HTP >= v79 is above every device (highest: v75)" in message


def test_an_unknown_serial_and_a_missing_kind_are_refused(lab, pool_url):
    assert "no device nosuch" in _refused(lab, serial="nosuch")
    assert "no single device has all of it" in _refused(lab, socs=["SM8650"], virtual=False)
    lab.sync([fake_device("a8650"), fake_device("b8650")])  # c8550 offline: it still counts
    assert "no virtual device" not in _refused(lab, socs=["SM8750"])
    assert "no physical device" not in _refused(lab, socs=["SM8750"], virtual=False)


def test_offline_and_quarantined_devices_still_could_serve(lab):
    lab.quarantine("c8550", "usb resets")
    with pytest.raises(LeaseTimeout, match="quarantined"):
        lab.acquire(LeaseRequest(socs=["SM8550"]), ttl_s=30, timeout_s=0.2)
    lab.sync([fake_device("b8650")])  # a8650 and c8550 are gone from the adb server
    with pytest.raises(LeaseTimeout, match="offline"):
        lab.acquire(LeaseRequest(tags=["flagship"]), ttl_s=30, timeout_s=0.2)


def test_an_excluded_device_still_counts(lab):
    with pytest.raises(LeaseTimeout):
        lab.acquire(LeaseRequest(socs=["SM8550"], exclude=["c8550"]), ttl_s=30, timeout_s=0.2)


def test_a_device_of_unknown_soc_could_be_any_soc(pool):
    pool.sync([fake_device("dev0"), fake_device("phone", state="unauthorized")])
    with pytest.raises(LeaseTimeout):  # the unauthorized phone may be an SM8750
        pool.acquire(LeaseRequest(socs=["SM8750"]), ttl_s=30, timeout_s=0.2)
    assert "unknown SoC 'SM87500'" in _refused(pool, socs=["SM87500"])  # a name is still checked


def test_an_empty_pool_waits_until_its_timeout(pool):
    started = time.monotonic()
    with pytest.raises(LeaseTimeout, match="no device in the pool matches"):
        pool.acquire(LeaseRequest(socs=["SM865O"]), ttl_s=30, timeout_s=0.5)
    assert time.monotonic() - started >= 0.5


def test_a_pool_soc_outside_the_table_is_known(pool):
    pool.sync([fake_device("mid", "SM7675", None)])
    lease = pool.acquire(LeaseRequest(socs=["sm7675"]), ttl_s=30, timeout_s=1)
    assert lease.serial == "mid"
    assert "did you mean SM7675" in _refused(pool, socs=["SM7657"])
