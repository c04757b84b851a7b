"""JUnit files checked against junit-10.xsd (fetched by ci/setup.sh: see ci/junit_schema.py).

Both the farm's JUnit and pytest's ``--junitxml`` put ``<properties>`` on a ``<testcase>`` (the device
and bundle of each test), which junit-10.xsd has no place for but which Jenkins' JUnit plugin and
GitLab read; the farm's also gives each testcase its ``file`` (GitLab links a test to it, as pytest's
xunit1 family does). ``valid_junit`` takes exactly those two out, then validates the rest: every other
element and attribute must be the schema's."""

from __future__ import annotations

import importlib.util
import sys
import xml.etree.ElementTree as ET
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@cache
def _schema():
    import xmlschema

    spec = importlib.util.spec_from_file_location("junit_schema", REPO / "ci" / "junit_schema.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("junit_schema", module)
    spec.loader.exec_module(module)
    if not module.TARGET.is_file():
        pytest.fail(f"{module.TARGET} is missing: run ci/setup.sh (it fetches the JUnit schema)")
    return xmlschema.XMLSchema(str(module.TARGET))


def valid_junit(path: Path) -> dict[str, dict[str, str]]:
    """Validate the JUnit file ``path`` (AssertionError naming the file and the schema's complaint);
    return each testcase's properties (by testcase name)."""
    tree = ET.parse(path)
    properties: dict[str, dict[str, str]] = {}
    for case in tree.getroot().iter("testcase"):
        for props in case.findall("properties"):
            properties[case.get("name", "")] = {p.get("name"): p.get("value") for p in props}
            case.remove(props)
        case.attrib.pop("file", None)
    errors = [str(e.reason or e) for e in _schema().iter_errors(tree)]
    assert not errors, f"{path}: not valid JUnit (junit-10.xsd): " + "; ".join(errors[:5])
    return properties
