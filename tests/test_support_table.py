"""README's support table is kept true: the refusals in ``config.py`` are exactly the table's "refused" rows.

Every backticked term in the first cell of a row marked **refused** must appear in the text of some refusal
(``_refuse(what, change)`` in ``sgl_eagle_triton/config.py``, module-level string constants substituted), and every
refusal's text must contain a backticked term of some refused row.
"""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def support_rows() -> list[tuple[str, str]]:
    """``(feature cell, status cell)`` of every row of README's "## Support" table."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Support\n", 1)[1].split("\n## ", 1)[0]
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
    assert not missing, f"README marks these refused, but no refusal in config.py names them: {missing}"


def test_every_refusal_has_a_refused_row():
    terms = refused_terms()
    assert terms
    unlisted = [text for text in refusal_texts() if not any(term in text for term in terms)]
    assert not unlisted, f"config.py refuses these; no refused row of README's support table names them: {unlisted}"
