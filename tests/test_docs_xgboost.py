"""The Python blocks of docs/xgboost.md run as written (about 5 s on 2 cores)."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "xgboost.md"


def test_the_xgboost_page_runs(ray_cluster):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    assert blocks, "the page has no Python block"
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), {"__name__": "docs_xgboost"})
