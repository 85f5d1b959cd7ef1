"""The command line's arguments (`annotated_transformer.cli.arguments`, book/a08_cli.ipynb):
KEY=VALUE words, numbers and device names checked where they are parsed."""

import argparse

import pytest
import torch

from annotated_transformer.cli.arguments import (
    CommandParser,
    UsageError,
    device_option,
    non_negative,
    parse_override,
    positive_int,
)


@pytest.mark.parametrize(
    "word, expected",
    [
        ("steps=200", ("steps", 200)),
        ("clip_norm=null", ("clip_norm", None)),
        ("clip_norm=None", ("clip_norm", None)),
        ("direction=en-de", ("direction", "en-de")),
        ("label_smoothing=0.0", ("label_smoothing", 0.0)),
    ],
)
def test_a_setting_is_read_as_json_or_kept_as_text(word, expected):
    assert parse_override(word) == expected


@pytest.mark.parametrize("word", ["steps", "=3", "--steps=3"])
def test_a_word_that_is_no_setting_is_a_usage_error(word):
    with pytest.raises(UsageError, match="settings are given as KEY=VALUE"):
        parse_override(word)


def test_numbers_are_checked_where_they_are_parsed():
    assert positive_int("4") == 4 and non_negative(float)("0.6") == 0.6 and non_negative(int)("0") == 0
    for convert, text in (
        (positive_int, "0"),
        (positive_int, "x"),
        (non_negative(float), "nan"),
        (non_negative(float), "-1"),
        (non_negative(int), "1.5"),
    ):
        with pytest.raises(argparse.ArgumentTypeError, match=repr(text)):
            convert(text)


def test_a_device_name_pytorch_does_not_know_is_a_usage_error_and_none_lets_the_code_choose():
    assert device_option("cuda:1") == torch.device("cuda", 1) and device_option(None) is None
    with pytest.raises(UsageError, match="--device 'tpu' is not a device name"):
        device_option("tpu")


def test_the_parser_raises_instead_of_ending_the_process():
    parser = CommandParser(prog="x")
    parser.add_argument("--beam", type=positive_int)
    with pytest.raises(UsageError, match="argument --beam: expected a positive whole number, got '0'"):
        parser.parse_args(["--beam", "0"])
