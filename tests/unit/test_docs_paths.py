"""Docs and SQL comments name files of the relay (`relay/pg/store.py`, `bench/report.py`): each
such path must exist, so a move or a rename cannot leave a reader at a file that is gone. A
path after a commit (`00f8d6b:bench/compare/flow-nap.md`) names a file of git history."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# A repository path: not the tail of a longer path (an image's /opt/relay/lib/...) nor a file
# of git history (commit:path).
PATH = re.compile(r"(?<![/\w.:])(?:relay|bench|sql|deploy|tests)/[A-Za-z0-9_./-]+"
                  r"\.(?:py|sql|md|yaml|yml)\b")


def test_every_file_the_docs_name_exists() -> None:
    sources = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
               *sorted((ROOT / "sql").rglob("*.sql"))]
    missing = sorted({f"{src.relative_to(ROOT)}: {path}"
                      for src in sources for path in PATH.findall(src.read_text())
                      if not (ROOT / path).exists()})
    assert missing == []
