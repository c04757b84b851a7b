"""Fixtures: the exported reference bundle (cached by content, so only the first run exports)."""
