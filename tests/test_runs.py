"""Runs, recipes and checkpoints (`annotated_transformer.runs`, book/a2_runs.ipynb): the messages a user gets for a
recipe file or a checkpoint that is not what it should be."""

import pytest

from annotated_transformer.runs import CheckpointError, Recipe, load_checkpoint


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


def test_a_file_that_is_no_checkpoint_says_what_a_checkpoint_is(tmp_path):
    text = tmp_path / "notes.pt"
    text.write_text("hello, this is no checkpoint\n")
    with pytest.raises(
        CheckpointError,
        match=r"notes.pt: not a checkpoint: a checkpoint is a file that torch.save "
        r"writes .* starts with b'hell'",
    ):
        load_checkpoint(text)
    empty = tmp_path / "empty.pt"
    empty.touch()
    with pytest.raises(CheckpointError, match="empty.pt: not a readable checkpoint"):  # cut short, not foreign
        load_checkpoint(empty)
