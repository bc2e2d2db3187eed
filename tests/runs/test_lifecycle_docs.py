"""The README's lifecycle table is the declared one (`runs.transitions.table`)."""

import re
from pathlib import Path

from django.conf import settings

from runs.transitions.table import markdown

BLOCK = re.compile(r"<!-- lifecycle:begin[^>]*-->\n(.*?)<!-- lifecycle:end -->", re.S)


def readme_table(text):
    found = BLOCK.findall(text)
    assert len(found) == 1, "the README needs one block between <!-- lifecycle:begin --> and <!-- lifecycle:end -->"
    return found[0]


def test_the_readme_lifecycle_table_is_generated_from_the_declared_one():
    readme = (Path(settings.BASE_DIR) / "README.md").read_text()
    expected = markdown()
    assert readme_table(readme) == expected, "README's lifecycle table is stale; paste this:\n" + expected


def test_the_check_notices_a_stale_copy():
    stale = "<!-- lifecycle:begin -->\n" + markdown().replace("`retire` | `queued`, ", "`retire` | ") + \
            "<!-- lifecycle:end -->"
    assert readme_table(stale) != markdown()
