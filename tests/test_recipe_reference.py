"""docs/recipes.md documents every recipe, rule and profile key as the models define it; `soarpack recipes NAME`
prints the built-in file itself; the built-ins cite only what is in this repo."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from soarpack.cli import app
from soarpack.recipe import reference
from soarpack.recipe.files import PROFILES_DIR, RECIPES_DIR
from soarpack.recipe.model import list_recipes, load_recipe

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "recipes.md"
runner = CliRunner()


def test_docs_recipes_md_is_the_rendering_of_the_models():
    text = DOC.read_text(encoding="utf-8")
    start, end = text.index(reference.BEGIN), text.index(reference.END) + len(reference.END)
    assert text[start:end] + "\n" == reference.render(), \
        "docs/recipes.md is stale: paste the output of `python -m soarpack.recipe.reference` between its markers"


def test_every_field_has_a_meaning_and_no_meaning_lacks_a_field(monkeypatch):
    monkeypatch.delitem(reference.RULE, "note")
    with pytest.raises(KeyError, match="undocumented keys: \\['note'\\]"):
        reference.render()
    monkeypatch.setitem(reference.RULE, "note", ("string", "x"))
    monkeypatch.setitem(reference.SERVE, "gone", ("string", "a key the model does not have"))
    with pytest.raises(KeyError, match="does not have: \\['gone'\\]"):
        reference.render()


def test_defaults_in_the_reference_come_from_the_models():
    rendered = reference.render()
    assert "| `rows` | integer >= 1 | `256` |" in rendered and "| `damp` | float in (0, 1) | `0.05` |" in rendered
    assert "| `layers` | " in rendered and '| `"all"` |' in rendered


@pytest.mark.parametrize("name", list_recipes())
def test_recipes_name_prints_the_built_in_file_byte_for_byte(name, tmp_path):
    res = runner.invoke(app, ["recipes", name])
    assert res.exit_code == 0, res.output
    assert res.stdout == (RECIPES_DIR / f"{name}.toml").read_text(encoding="utf-8")
    mine = tmp_path / "my.toml"
    mine.write_text(res.stdout, encoding="utf-8")
    copy, builtin = load_recipe(str(mine)), load_recipe(name)
    assert (copy.rules, copy.base, copy.evidence) == (builtin.rules, builtin.base, builtin.evidence)


def test_recipes_without_a_name_lists_them_all():
    res = runner.invoke(app, ["recipes"])
    assert res.exit_code == 0
    assert [line.split(":")[0] for line in res.stdout.splitlines() if not line.startswith(" ")] == list_recipes()


def _anchors(doc: Path) -> set:
    return {re.sub(r"[^a-z0-9 -]", "", h.lower()).strip().replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", doc.read_text(encoding="utf-8"), flags=re.M)}


@pytest.mark.parametrize("path", sorted(RECIPES_DIR.glob("*.toml")) + sorted(PROFILES_DIR.glob("*.toml")),
                         ids=lambda p: p.name)
def test_built_ins_cite_only_what_is_in_the_repo(path):
    text = path.read_text(encoding="utf-8")
    assert "SALA.md" not in text  # ../shared/docs/SALA.md is not in the repo; docs/evidence.md quotes it
    for ref in re.findall(r"docs/[\w.-]+\.md(?:#[\w-]+)?", text):
        doc, _, anchor = ref.partition("#")
        assert (ROOT / doc).is_file(), ref
        if anchor:
            assert anchor in _anchors(ROOT / doc), ref
