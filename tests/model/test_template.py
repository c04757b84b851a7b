"""The chat templates as data (farm/model/template.py): a prompt's braces are its own text."""

from __future__ import annotations

import pytest

from farm.model.template import FAMILIES, format_prompt


@pytest.mark.parametrize("version", FAMILIES)
def test_braces_in_a_prompt_are_text_never_template_fields(version):
    plain = format_prompt("P", "S", version)
    braced = format_prompt("{prompt}{system}{0}{", "{system}}", version)
    assert braced == plain.replace("P", "{prompt}{system}{0}{").replace("S", "{system}}")
