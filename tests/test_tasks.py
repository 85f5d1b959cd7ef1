"""The tasks' data (`annotated_transformer.lib.tasks`): tasks by name; vocabularies from the training split only,
either direction, words or subwords, Multi30k and Tatoeba."""

import dataclasses

import pytest
import torch
from conftest import needs_mirror

from annotated_transformer import TransformerConfig, make_model
from annotated_transformer.lib.checkpoints import save_checkpoint
from annotated_transformer.lib.datasets import load_multi30k, load_tatoeba
from annotated_transformer.lib.evaluate import evaluate_translator
from annotated_transformer.lib.recipes import RECIPES
from annotated_transformer.lib.tasks import load_task
from annotated_transformer.lib.tokenizers import Subwords, Vocab, WordTokenizer, dataset_subwords
from annotated_transformer.lib.trainer import train
from annotated_transformer.lib.translate import Translator
from annotated_transformer.training import BOS, EOS, UNK


def test_an_unknown_task_names_the_known_ones():
    from annotated_transformer.lib.recipes import RECIPES
    from annotated_transformer.lib.tasks import load_task

    with pytest.raises(ValueError, match=r"unknown task 'kopy'; the tasks are copy, multi30k, tatoeba, wmt14"):
        load_task(dataclasses.replace(RECIPES["copy"], task="kopy"))


def test_vocabulary_is_deterministic_with_specials_first_and_unknown_words():
    sentences = [["b", "a", "c"], ["a", "b"], ["a", "d"]]
    vocab = Vocab.build(sentences, min_freq=2)
    assert vocab.itos == ["<pad>", "<s>", "</s>", "<unk>", "a", "b"]
    assert vocab.encode(["a", "c", "zzz"]) == [4, 3, 3] and vocab.decode([4, 5]) == ["a", "b"]
    assert Vocab.build(reversed(sentences), min_freq=1).itos == Vocab.build(sentences, min_freq=1).itos
    with pytest.raises(ValueError, match="starts with"):
        Vocab(["a", "<pad>"])


def test_tokenizer_round_trip_and_the_task_vocabulary_comes_from_training_data_only():
    english = WordTokenizer("en")
    assert english(["A dog, running.  ", ""]) == [["A", "dog", ",", "running", "."], []]
    assert english.detokenize(["A", "dog", ",", "running", "."]) == "A dog, running."
    # a hyphen inside a word comes back joined; a free-standing dash keeps its spaces
    tokens = english(["A t-shirt - and a well-known dog-"])[0]
    assert tokens == ["A", "t", "@-@", "shirt", "-", "and", "a", "well", "@-@", "known", "dog-"]
    assert english.detokenize(tokens) == "A t-shirt - and a well-known dog-"
    task = load_task(RECIPES["multi30k-tiny"])  # words seen at least twice (min_freq=2)
    # The English training split has 10,833 distinct tokens, 6,187 of them seen at least twice; a vocabulary that
    # had seen the test set would be larger, and would hold words found only there (Barcelona, Corazon, Dali).
    assert len(task.vocab["tgt"]) == 4 + 6_187
    assert not {"Barcelona", "Corazon", "Dali", "Oregon", "Australian"} & set(task.vocab["tgt"])  # the last two: once
    assert task.vocab["direction"] == "de-en" and task.tgt_vocab == len(task.vocab["tgt"])
    src, tgt = task.train[0]
    assert src[-1] == EOS and tgt[0] == BOS and tgt[-1] == EOS and len(task.train) == 29_000


def test_the_other_direction_swaps_the_sides():
    de_en, en_de = load_task(RECIPES["multi30k-tiny"]), load_task(RECIPES["multi30k-tiny"].replace(direction="en-de"))
    assert en_de.vocab["direction"] == "en-de"
    assert en_de.vocab["src"] == de_en.vocab["tgt"] and en_de.vocab["tgt"] == de_en.vocab["src"]
    assert en_de.train[0][0][:-1] == de_en.train[0][1][1:-1] and en_de.src_vocab == de_en.tgt_vocab


def test_training_on_multi30k_records_vocabularies_and_a_validation_bleu(tiny_run):
    run_dir, summary = tiny_run
    assert summary["finished"] and "valid_greedy_bleu" in summary and "case:mixed" in summary["bleu_signature"]
    translator = Translator.from_checkpoint(*sorted((run_dir / "checkpoints").glob("*.pt")))  # averaged
    assert translator.direction == "de-en" and len(translator.codec.tgt_vocab) > 1000


def test_multi30k_with_subwords_is_one_vocabulary_for_both_languages_and_directions():
    recipe = RECIPES["multi30k-cpu"]
    de_en, en_de = load_task(recipe), load_task(recipe.replace(direction="en-de"))
    assert de_en.vocab["kind"] == "sentencepiece" and de_en.vocab["dataset"] == "multi30k"
    assert de_en.vocab["model"] == en_de.vocab["model"] and de_en.src_vocab == de_en.tgt_vocab == recipe.subwords
    subwords = Subwords(de_en.vocab["model"])
    german, english = load_multi30k("valid")[0]
    source, target = de_en.valid[0]
    assert source == subwords.encode([german])[0] + [EOS] and target == [BOS] + subwords.encode([english])[0] + [EOS]
    assert en_de.valid[0] == (target[1:], [BOS] + source)  # the same ids, the sides swapped
    assert len(de_en.train) == 29_000 and not any(UNK in s or UNK in t for s, t in de_en.train)  # byte fallback
    model = make_model(de_en.src_vocab, de_en.tgt_vocab, recipe.model)  # one matrix for all three, §3.4
    assert model.src_embed[0].lut.weight is model.tgt_embed[0].lut.weight is model.generator.proj.weight


@needs_mirror
def test_tatoeba_is_a_subword_task_in_both_directions_scored_by_characters_into_chinese(tmp_path, capsys):
    from annotated_transformer.cli import main

    zh_en = dataclasses.replace(RECIPES["multi30k-cpu"], task="tatoeba", direction="zh-en")
    with pytest.raises(ValueError, match="the tatoeba task needs subwords"):
        load_task(zh_en.replace(subwords=None))
    task, other = load_task(zh_en), load_task(zh_en.replace(direction="en-zh"))
    assert task.vocab["dataset"] == "tatoeba" and task.vocab["model"] == other.vocab["model"]
    assert (len(task.train), len(task.valid)) == (27_155, 1_000) and other.valid[0] == (
        task.valid[0][1][1:],
        [BOS] + task.valid[0][0],
    )
    subwords = Subwords(task.vocab["model"])
    chinese, english = load_tatoeba("valid")[0]
    assert subwords.decode(task.valid[0][0][:-1]) == chinese and subwords.decode(task.valid[0][1][1:-1]) == english
    torch.manual_seed(0)
    config = TransformerConfig(N=1, d_model=32, d_ff=64, h=4)
    model = make_model(task.src_vocab, task.tgt_vocab, config)  # untrained: the scores are low, their kind counts
    result = evaluate_translator(Translator(model, task.vocab), "valid", beam_size=1, extra_len=1)
    assert result["dataset"] == "tatoeba" and len(result["hypotheses"]) == 1_000
    assert "tok:13a" in result["bleu_signature"] and "tokenized_lowercase_bleu" in result
    # into Chinese, through the command: sacreBLEU's zh tokenizer, and no tokenized BLEU of spaCy's words
    path = save_checkpoint(
        tmp_path / "step-000001.pt",
        {
            "config": dataclasses.asdict(config),
            "model": model.state_dict(),
            "step": 1,
            "src_vocab": other.src_vocab,
            "tgt_vocab": other.tgt_vocab,
            "vocab": other.vocab,
        },
    )
    args = ["--checkpoint", str(path), "--split", "valid", "--beam-size", "1", "--extra-len", "1"]
    assert main(["evaluate", *args, "--results", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "translating Tatoeba valid with beam 1" in err and "tok:zh" in out and "tokenized" not in out


@needs_mirror
def test_tatoeba_with_a_vocabulary_per_language(tmp_path):
    recipe = dataclasses.replace(RECIPES["multi30k-cpu"], task="tatoeba", direction="zh-en")
    task, other = (
        load_task(recipe.replace(shared_subwords=False)),
        load_task(recipe.replace(shared_subwords=False, direction="en-zh")),
    )
    assert "model" not in task.vocab and task.vocab["src_model"] == other.vocab["tgt_model"]  # Chinese's, either side
    chinese, english = Subwords(task.vocab["src_model"]), Subwords(task.vocab["tgt_model"])
    assert (task.src_vocab, task.tgt_vocab) == (len(chinese), len(english)) == (4000, 4000)
    assert not any("\u4e00" <= c <= "\u9fff" for i in range(len(english)) for c in english.processor.id_to_piece(i))
    zh, en = load_tatoeba("valid")[0]
    assert chinese.decode(task.valid[0][0][:-1]) == zh and english.decode(task.valid[0][1][1:-1]) == en
    with pytest.raises(ValueError, match="tatoeba has no language 'de'; it has zh and en"):
        dataset_subwords("tatoeba", 4000, "de")
    # trained (the task's vocabulary reaches make_model) and read back: the checkpoint keeps both models, and the
    # source embedding is a matrix of its own; the target embedding is still the output layer's (§3.4)
    tiny = recipe.replace(
        shared_subwords=False,
        N=1,
        d_model=32,
        d_ff=64,
        h=4,
        max_len=8,
        steps=1,
        eval_every=1,
        checkpoint_every=1,
        keep_checkpoints=1,
        average_checkpoints=1,
    )
    with pytest.warns(UserWarning, match="were cut to fit"):  # the final check's sources, for 8 positions
        train(tiny, tmp_path / "run", device="cpu", progress=False)
    translator = Translator.from_checkpoint(tmp_path / "run")
    source, target = translator.model.src_embed[0].lut.weight, translator.model.tgt_embed[0].lut.weight
    assert source is not target and not torch.equal(source, target) and translator.model.generator.proj.weight is target
    assert translator.codec.source_ids(["猫抓老鼠。"]) == chinese.encode(["猫抓老鼠。"])
    assert translator.codec.target_ids(["The cat."]) == english.encode(["The cat."])
    assert isinstance(translator.translate("猫抓老鼠。", beam_size=1, extra_len=2), str)
