"""docs/alerts.md shows the receiver the tests use, word for word."""

import re

from tests.runs.alerts.conftest import RECEIVER


def test_the_documented_receiver_is_the_file_the_tests_send_to():
    doc = (RECEIVER.parent / "alerts.md").read_text()
    block = re.search(r"<!-- receiver: docs/alert_receiver.py -->\n```python\n(.*?)```\n<!-- /receiver -->", doc, re.S)
    assert block and block.group(1) == RECEIVER.read_text()
    code = [line for line in RECEIVER.read_text().splitlines() if line.strip() and not line.startswith('"""')]
    assert len(code) <= 20  # "about ten lines": short enough to read in one look
