"""Django's {# #} comment is one line only: one spanning lines is printed on the page
(the triage page showed its own implementation note). Multi-line ones are {% comment %}."""

import re
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


def test_no_template_has_a_multi_line_short_comment():
    found = []
    for path in sorted(TEMPLATES.rglob("*.html")):
        text = path.read_text()
        for line_no, line in enumerate(text.splitlines(), 1):
            opened = line.rfind("{#")
            if opened != -1 and "#}" not in line[opened:]:
                found.append(f"{path.relative_to(TEMPLATES)}:{line_no}")
    assert not found, f"multi-line {{# #}} comments (use {{% comment %}}): {', '.join(found)}"

