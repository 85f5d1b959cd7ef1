"""Recipes (`annotated_transformer.lib.recipes`): the messages a user gets for a recipe that is not what it should
be, settings that change training and those that do not."""

import pytest

from annotated_transformer.lib.recipes import RECIPES, Recipe


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
    from annotated_transformer.lib.recipes import RECIPES

    for name, recipe in RECIPES.items():
        assert recipe.name == name and Recipe.from_dict(recipe.to_dict()) == recipe


@pytest.mark.parametrize("name", ["", "../x", "/x", "x/y", ".hidden", "a b", None])
def test_a_recipe_name_is_a_plain_name(name):
    from annotated_transformer.lib.recipes import RECIPES

    with pytest.raises(ValueError, match="name must be a plain name"):
        Recipe.from_dict({**RECIPES["copy"].to_dict(), "name": name})


@pytest.mark.parametrize("seed", [10**23, 2**63, -1])
def test_a_seed_that_no_generator_takes_is_a_settings_mistake(seed, tmp_path, capsys):
    "Refused with the other settings (exit 2), not as an overflow once training has begun."
    from annotated_transformer.cli import main
    from annotated_transformer.lib.recipes import RECIPES

    with pytest.raises(ValueError, match=r"seed must be a whole number from 0 to 2\*\*63 - 1"):
        RECIPES["copy"].replace(seed=seed)
    assert main(["train", "copy", f"seed={seed}", "--out", str(tmp_path / "run")]) == 2
    assert "seed must be a whole number" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_recipe_trains_differently_in_all_but_the_checkpoints_it_keeps():
    recipe = RECIPES["multi30k-cpu"]
    assert recipe.trains_differently(recipe.replace(keep_checkpoints=20).to_dict()) == []
    assert recipe.differences(recipe.replace(keep_checkpoints=20).to_dict()) == ["keep_checkpoints"]
    other = recipe.replace(keep_checkpoints=20, dropout=0.0, steps=2200).to_dict()
    assert recipe.trains_differently(other) == ["dropout", "steps"]


def test_subwords_must_be_a_positive_number_of_pieces_or_none():
    for bad in (0, -8000, 2.5, True, "8000"):
        with pytest.raises(ValueError, match="subwords must be a positive integer or None"):
            RECIPES["multi30k-cpu"].replace(subwords=bad)
    assert RECIPES["multi30k-tiny"].subwords is None and RECIPES["multi30k-tiny"].replace(subwords=500).subwords == 500


def test_shared_subwords_is_a_choice_of_subword_recipes_and_absent_means_shared():
    recipe = RECIPES["multi30k-cpu"]
    for bad in (0, None, "no"):
        with pytest.raises(ValueError, match="shared_subwords must be True or False"):
            recipe.replace(shared_subwords=bad)
    with pytest.raises(ValueError, match="shared_subwords=False learns a subword vocabulary per language: it needs"):
        RECIPES["multi30k-tiny"].replace(shared_subwords=False)
    stored = {k: v for k, v in recipe.to_dict().items() if k != "shared_subwords"}  # a run stored before the setting
    assert recipe.differences(stored) == [] and Recipe.from_dict(stored) == recipe
    assert recipe.replace(shared_subwords=False).differences(stored) == ["shared_subwords"]
