"""Recipes and tasks (`annotated_transformer.recipes`, book/a2_recipes.ipynb): the messages a user gets for a
recipe that is not what it should be, and the tasks by name."""

import dataclasses

import pytest

from annotated_transformer.recipes import Recipe


def test_a_recipe_file_with_unknown_settings_names_them_and_the_settings_there_are():
    with pytest.raises(
        ValueError,
        match=r"not a recipe of this version: unknown setting\(s\) stepz; recipe settings: "
        r".*\bsteps\b.*; model settings: .*\bd_model\b",
    ):
        Recipe.from_dict({"name": "copy", "task": "copy", "stepz": 3})
    with pytest.raises(ValueError, match=r"unknown setting\(s\) colour, lr \(the learning rate follows equation"):
        Recipe.from_dict({"name": "copy", "task": "copy", "lr": 1e-3, "model": {"colour": "blue"}})
    with pytest.raises(ValueError, match="not a recipe of this version .*'task'"):  # a required setting missing
        Recipe.from_dict({"name": "copy"})


def test_every_recipe_reads_back_from_its_plain_values():
    from annotated_transformer.recipes import RECIPES

    for name, recipe in RECIPES.items():
        assert recipe.name == name and Recipe.from_dict(recipe.to_dict()) == recipe


def test_an_unknown_task_names_the_known_ones():
    from annotated_transformer.recipes import RECIPES, load_task

    with pytest.raises(ValueError, match=r"unknown task 'kopy'; the tasks are copy, multi30k, tatoeba, wmt14"):
        load_task(dataclasses.replace(RECIPES["copy"], task="kopy"))


@pytest.mark.parametrize("name", ["", "../x", "/x", "x/y", ".hidden", "a b", None])
def test_a_recipe_name_is_a_plain_name(name):
    from annotated_transformer.recipes import RECIPES

    with pytest.raises(ValueError, match="name must be a plain name"):
        Recipe.from_dict({**RECIPES["copy"].to_dict(), "name": name})


@pytest.mark.parametrize("seed", [10**23, 2**63, -1])
def test_a_seed_that_no_generator_takes_is_a_settings_mistake(seed, tmp_path, capsys):
    "Refused with the other settings (exit 2), not as an overflow once training has begun."
    from annotated_transformer.cli import main
    from annotated_transformer.recipes import RECIPES

    with pytest.raises(ValueError, match=r"seed must be a whole number from 0 to 2\*\*63 - 1"):
        RECIPES["copy"].replace(seed=seed)
    assert main(["train", "copy", f"seed={seed}", "--out", str(tmp_path / "run")]) == 2
    assert "seed must be a whole number" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
