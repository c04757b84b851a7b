"""A measurement's conditions read from what a phone prints (farm/device/conditions.py): every reading
or None, never a guess."""

from __future__ import annotations

from farm.device.conditions import Conditions, parse_conditions

PHONE = """Current Battery Service state:
  AC powered: false
  USB powered: true
  status: 2
  level: 64
  temperature: 334
@@thermal
IsStatusOverride: false
Thermal Status: 2
Cached temperatures:
@@idle
IDLE
@@screen
false
@@governor
schedutil
schedutil
performance
"""


def test_a_phones_readings_are_all_kept():
    c = parse_conditions(PHONE)
    assert c == Conditions(battery_level=64, battery_temp_c=33.4, charging=True, thermal_status=2,
                           idle="IDLE", governors="performance,schedutil", screen_on=False)
    assert c.throttling  # MODERATE and above


def test_what_a_device_does_not_say_is_none():
    c = parse_conditions("Current Battery Service state:\n  level: 90\n@@thermal\n@@idle\n"
                         "Unknown get option: deep\n@@screen\nUnknown get option: screen\n@@governor\n")
    assert c.battery_level == 90 and c.battery_temp_c is None and c.charging is None
    assert (c.thermal_status, c.idle, c.governors, c.screen_on) == (None, None, None, None)
    assert not c.throttling
