"""Fixtures: virtual Snapdragon devices behind a real adb server of the test's own."""
