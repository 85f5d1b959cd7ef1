"""Files written whole (`annotated_transformer.lib.files`): a write that fails names the file and leaves the old one."""

import os

import pytest


def test_a_write_that_fails_names_the_file_it_was_for(tmp_path, monkeypatch):
    "Not the hidden temporary file: the one the user knows."
    from annotated_transformer.lib.files import write_json

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match=r"No space left on device: '.*summary.json'"):
        write_json(tmp_path / "summary.json", {"steps": 1})
    assert list(tmp_path.iterdir()) == []
