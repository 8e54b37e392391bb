"""bench/results holds current results only: every file there is cited by README.md, a document in docs/ or
bench/README.md (superseded results leave the tree; git keeps them), and every link into it resolves.

A report's companions count as cited with it: a file is cited when its name without the extension, followed by a dot
(``<stem>.md``, ``<stem>.json``, ``<stem>.png``, ``<stem>.txt``), appears in one of those documents, so a link to
``x.md`` cites ``x.json`` and ``x.png`` but not ``x-other.json``.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def citing_documents() -> dict[Path, str]:
    docs = [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return {doc: doc.read_text() for doc in docs}


def test_every_result_is_cited():
    text = "\n".join(citing_documents().values())
    files = sorted(p for p in RESULTS.iterdir() if p.is_file())
    assert files
    uncited = [p.name for p in files if f"{p.name.rsplit('.', 1)[0]}." not in text]
    assert not uncited, f"not cited by README.md, docs/ or bench/README.md (remove them: git keeps them): {uncited}"


def test_every_link_into_bench_results_resolves():
    dangling = []
    for doc, text in citing_documents().items():
        for target in re.findall(r"\]\(([^)#\s]*bench/results/[^)#\s]+)", text):
            if not (doc.parent / target).resolve().is_file():
                dangling.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not dangling, dangling
