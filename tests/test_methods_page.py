"""The methods table a newcomer reads (`metarag methods`, docs/methods.md, the README's table) comes
from the registry and the cards, and stays current."""
from pathlib import Path

from metarag.api import method_table, methods_markdown
from metarag.methods.catalog import CARDS, HELPERS
from metarag.methods.registry import METHODS

REPO = Path(__file__).resolve().parents[1]


def test_every_method_of_ours_has_a_card_and_helpers_are_not_listed():
    assert set(CARDS) == set(METHODS) - HELPERS
    names = [row["method"] for row in method_table(own=True)]
    assert "sim-rag-practice" not in names and set(names) == set(CARDS)
    for row in method_table(own=True):
        assert row["what"] and row["paper"], row  # no empty "what" (closed-book, cot ... had none)
        assert "test" not in row["what"].lower(), row  # no internals ("tests inject a fake")
    papers = {row["method"]: row["paper"] for row in method_table(own=True)}
    assert papers["search-r1"] == "Jin et al., 2025" and papers["belief-agent"] == "Qi et al., 2026"


def test_docs_methods_md_is_what_metarag_methods_markdown_prints():
    page = (REPO / "docs" / "methods.md").read_text()
    assert page == methods_markdown(), "docs/methods.md is stale: metarag methods --markdown > docs/methods.md"


def test_the_readme_methods_table_is_the_registrys():
    readme = (REPO / "README.md").read_text()
    table = methods_markdown().split("\n\n## ")[0].split("\n\n", 2)[2]  # the page's table
    start, end = "<!-- methods-table -->\n", "\n<!-- /methods-table -->"
    assert start in readme, "the README's methods table is generated: put it between the methods-table markers"
    assert readme.split(start)[1].split(end)[0] == table.strip()
