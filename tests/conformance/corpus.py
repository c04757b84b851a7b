"""The conformance corpus (corpus.toml beside this file): what qnn_llama_runner v1.0.1 writes, as data.

Loaded once; ``CORPUS`` is the parsed TOML. The helpers give the entries as tests parametrize them.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

PATH = Path(__file__).with_name("corpus.toml")
CORPUS: dict = tomllib.loads(PATH.read_text(encoding="utf-8"))

FAMILIES: list[str] = CORPUS["families"]["names"]
OBSERVER = CORPUS["observer"]
OBSERVER_KEYS: tuple[str, ...] = tuple(OBSERVER["keys"])
MESSAGES: dict[str, str] = CORPUS["messages"]
EOS_MARKERS: dict[str, str] = {e["family"]: e["marker"] for e in CORPUS["eos"]["family"]}


def entries(kind: str) -> list[dict]:
    """The entries of one kind: ``echo``, ``speed``, ``double``, ``run`` or ``observer.example``."""
    table = CORPUS
    for part in kind.split("."):
        table = table[part]
    return table


def ident(entry: dict) -> str:
    """A short test id for an entry."""
    if "name" in entry:
        return entry["name"]
    if "family" in entry:
        return f"{entry['family']}{'+system' if entry.get('system_prompt') else ''}"
    if "written" in entry:
        return entry["written"]
    return entry.get("line", "")[16:40]


def echo_of(family: str, system: bool = False) -> dict:
    """The echo entry of ``family``, with or without a system prompt."""
    return next(e for e in entries("echo") if e["family"] == family and bool(e["system_prompt"]) == system)
