"""The support matrix is kept true: the refusals in ``config.py`` are exactly docs/support.md's "refused" rows, and
README's support table is its one-line summary.

Every backticked term in the first cell of a docs/support.md row marked **refused** must appear in the text of some
refusal (``_refuse(what, change)`` in ``sgl_eagle_triton/config.py``, module-level string constants substituted), and
every refusal's text must contain a backticked term of some refused row. README's table has the same rows (first
cells equal, in the same order), each status one line of at most 120 characters with a link to its evidence, saying
no status (tested / untested / refused) that docs/support.md's row does not, and **refused** wherever it does.
"""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


README_STATUS_MAX = 120
STATUS = re.compile(r"\b(untested|tested|refused)\b")


def support_rows(doc: str = "docs/support.md") -> list[tuple[str, str]]:
    """``(feature cell, status cell)`` of every row of the first table of ``doc`` (README: of its "## Support")."""
    text = (ROOT / doc).read_text()
    section = text.split("\n## Support\n", 1)[1].split("\n## ", 1)[0] if doc == "README.md" else text
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        header = set(cells[0]) <= set("-: ") or cells[0] == "Feature / flag"
        if line.startswith("|") and len(cells) >= 2 and not header:
            rows.append((cells[0], cells[1]))
    return rows


def refused_terms() -> dict[str, str]:
    """``{backticked term of a refused row's feature cell: that row}``."""
    return {term: feature for feature, status in support_rows() if "**refused**" in status
            for term in re.findall(r"`([^`]+)`", feature)}


def refusal_texts() -> list[str]:
    """The literal text of every ``_refuse(...)`` call in config.py (both arguments; formatted values that name a
    module-level string constant are replaced by it, other formatted values by nothing)."""
    tree = ast.parse((ROOT / "sgl_eagle_triton" / "config.py").read_text())
    constants = {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
                 for t in node.targets if isinstance(t, ast.Name)
                 and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}

    def literal(node) -> str:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            return "".join(literal(v) for v in node.values)
        if isinstance(node, ast.FormattedValue):
            return constants.get(node.value.id, "") if isinstance(node.value, ast.Name) else ""
        if isinstance(node, ast.BinOp):
            return literal(node.left) + literal(node.right)
        return ""

    return [" ".join(literal(arg) for arg in node.args) for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "_refuse"]


def test_every_refused_row_names_a_refusal():
    texts = refusal_texts()
    assert len(texts) > 20
    missing = {term: row for term, row in refused_terms().items() if not any(term in text for text in texts)}
    assert not missing, f"docs/support.md marks these refused, but no refusal in config.py names them: {missing}"


def test_every_refusal_has_a_refused_row():
    terms = refused_terms()
    assert terms
    unlisted = [text for text in refusal_texts() if not any(term in text for term in terms)]
    assert not unlisted, f"config.py refuses these; no refused row of docs/support.md names them: {unlisted}"


def statuses(cell: str) -> set[str]:
    """The statuses a cell states in bold (``**GPU-tested**`` states tested)."""
    return {word for bold in re.findall(r"\*\*(.+?)\*\*", cell) for word in STATUS.findall(bold)}


def test_readme_table_is_the_one_line_summary_of_docs_support():
    readme, docs = support_rows("README.md"), support_rows()
    assert len(docs) > 30
    assert [feature for feature, _ in readme] == [feature for feature, _ in docs], (
        "README's support table and docs/support.md must list the same rows in the same order")
    for (feature, short), (_, full) in zip(readme, docs, strict=True):
        assert len(short) <= README_STATUS_MAX, f"README's status of {feature!r} is {len(short)} characters"
        assert re.search(r"\]\([^)]+\)", short), f"README's status of {feature!r} links no evidence"
        assert statuses(short) and statuses(short) <= statuses(full), (feature, statuses(short), statuses(full))
        assert ("refused" in statuses(short)) == ("refused" in statuses(full)), feature


def test_readme_cells_stay_short():
    for feature, status in support_rows("README.md"):
        assert len(feature) <= 200 and len(status) <= 200, feature
