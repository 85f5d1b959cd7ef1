"""Translating real data (`annotated_transformer.translation`, book/07_decoding.ipynb): vocabularies, incremental
decoding, beam search, checkpoint averaging, BLEU, results files, the Translator and the translate/evaluate
commands."""

import dataclasses
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import needs_mirror

from annotated_transformer import TransformerConfig, make_model
from annotated_transformer.attention import subsequent_mask
from annotated_transformer.checkpoints import save_checkpoint
from annotated_transformer.data import load_multi30k, load_tatoeba
from annotated_transformer.recipes import RECIPES, Recipe, load_task
from annotated_transformer.runs import record_result
from annotated_transformer.text import (
    SPECIALS,
    UNK,
    SubwordCodec,
    Subwords,
    Vocab,
    WordCodec,
    WordTokenizer,
    dataset_subwords,
)
from annotated_transformer.training import BOS, EOS, PAD, greedy_decode, pad_sequences, train
from annotated_transformer.translation import (
    ALPHA,
    BEAM_SIZE,
    EXTRA_LEN,
    IncrementalDecoder,
    Translator,
    average_checkpoints,
    beam_search,
    bleu_tokenizer,
    corpus_scores,
    decode_batches,
    decoding_variant,
    evaluate_translator,
    greedy_search,
    length_penalty,
)


# Words


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


# Decoding


def sharp_model(seed: int, vocab: int = 30, **settings):
    torch.manual_seed(seed)
    model = make_model(vocab, vocab, **{"N": 2, "d_model": 32, "d_ff": 64, "h": 4, **settings}).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.5)  # sharper distributions than at initialisation, so beams and steps differ
    return model.double()  # float64: equal computations in a different order agree to ~1e-12, so ties cannot flip


def random_sources(seed: int, vocab: int, lengths):
    g = torch.Generator().manual_seed(seed)
    src = pad_sequences([torch.randint(3, vocab, (n,), generator=g).tolist() + [EOS] for n in lengths])
    return src, (src != PAD)[:, None, :]


@pytest.mark.parametrize("settings", [{}, {"norm_first": True}, {"positional": "learned"}, {"share_embeddings": False}])
def test_incremental_steps_equal_a_full_forward_pass(settings):
    model = sharp_model(0, **settings)
    src, src_mask = random_sources(1, 30, [4, 9, 1])
    tgt = torch.randint(3, 30, (3, 8))
    tgt[:, 0] = BOS
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        full = model.generator(model.decode(memory, src_mask, tgt, subsequent_mask(8)))
        for cache in (True, False):
            decoder = IncrementalDecoder(model, memory, src_mask, cache=cache)
            steps = torch.stack([decoder.step(tgt[:, t]) for t in range(8)], dim=1)
            torch.testing.assert_close(steps, full, atol=1e-10, rtol=1e-10)


def test_selecting_rows_reorders_the_cache():
    model = sharp_model(2)
    src, src_mask = random_sources(3, 30, [5, 6, 7])
    tgt = torch.randint(3, 30, (3, 5))
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        decoder = IncrementalDecoder(model, memory, src_mask)
        for t in range(3):
            decoder.step(tgt[:, t])
        decoder.select(torch.tensor([2, 0]))
        last = decoder.step(tgt[[2, 0], 3])
        full = model.generator(model.decode(memory[[2, 0]], src_mask[[2, 0]], tgt[[2, 0], :4], subsequent_mask(4)))
    torch.testing.assert_close(last, full[:, -1], atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("beam_size", [1, 2, 4, 6])
def test_cached_and_uncached_search_agree(seed, beam_size):
    model = sharp_model(seed)
    src, src_mask = random_sources(seed, 30, [3, 8, 5, 1, 12])
    cached = beam_search(model, src, src_mask, beam_size=beam_size, extra_len=6)
    uncached = beam_search(model, src, src_mask, beam_size=beam_size, extra_len=6, cache=False)
    assert [h.tokens for h in cached] == [h.tokens for h in uncached]
    for a, b in zip(cached, uncached):
        assert a.score == pytest.approx(b.score, abs=1e-9) and a.log_prob == pytest.approx(b.log_prob, abs=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_greedy_search_is_greedy_decoding(seed):
    model = sharp_model(seed)
    src, src_mask = random_sources(seed, 30, [3, 8, 5, 12])
    greedy = greedy_search(model, src, src_mask, extra_len=5, banned=())  # greedy_decode may choose any token
    assert greedy == greedy_search(model, src, src_mask, extra_len=5, cache=False, banned=())
    reference = greedy_decode(model, src, src_mask, max_len=src.size(1) + 5)
    for g, r, n in zip(greedy, reference, src_mask.sum(dim=(1, 2)).tolist()):
        assert g == r[: len(g)]
        assert len(g) == len(r) or len(g) == n + 5 - 1  # stopped at </s>, or at its own length limit


def test_scores_are_length_normalised_log_probabilities():
    model = sharp_model(5)
    src, src_mask = random_sources(5, 30, [4, 6])
    memory = model.encode(src, src_mask)
    for alpha in (0.0, 0.6, 1.0):
        for i, hyp in enumerate(beam_search(model, src, src_mask, beam_size=3, alpha=alpha, extra_len=6)):
            tgt = torch.tensor([[BOS] + hyp.tokens])
            with torch.no_grad():
                log_probs = model.generator(
                    model.decode(memory[i : i + 1], src_mask[i : i + 1], tgt, subsequent_mask(tgt.size(1)))
                )[0]
            targets = hyp.tokens + [EOS]
            log_prob = sum(log_probs[t, tok].item() for t, tok in enumerate(targets))
            assert hyp.log_prob == pytest.approx(log_prob, abs=1e-9)
            assert hyp.score == pytest.approx(log_prob / length_penalty(len(targets), alpha), abs=1e-9)


def test_a_beam_wide_enough_finds_the_best_translation_exactly():
    model = sharp_model(7, vocab=5)
    src, src_mask = random_sources(7, 5, [1])  # two source positions, so at most 2 + 1 output tokens
    memory = model.encode(src, src_mask)
    best = None
    for n in range(3):  # every output: n tokens other than </s>, then </s>; the third token must be </s>
        for prefix in itertools.product([t for t in range(5) if t != EOS], repeat=n):
            tgt = torch.tensor([[BOS, *prefix]])
            with torch.no_grad():
                lp = model.generator(model.decode(memory, src_mask, tgt, subsequent_mask(tgt.size(1))))[0]
            log_prob = sum(lp[t, tok].item() for t, tok in enumerate([*prefix, EOS]))
            score = log_prob / length_penalty(n + 1, 0.6)
            best = max(best or (score, list(prefix)), (score, list(prefix)))
    hyp = beam_search(model, src, src_mask, beam_size=25, alpha=0.6, extra_len=1, banned=())[0]
    assert hyp.tokens == best[1] and hyp.score == pytest.approx(best[0], abs=1e-9)


def reference_beam_search(model, src, src_mask, k, alpha, limit):
    "The same search rules, one sentence at a time, re-running the decoder over each prefix: an oracle for the batch."
    memory = model.encode(src, src_mask)
    beams, finished = [([], 0.0)], []
    for length in range(1, limit + 1):
        candidates = []
        for tokens, score in beams:
            tgt = torch.tensor([[BOS, *tokens]])
            with torch.no_grad():
                lp = model.generator(model.decode(memory, src_mask, tgt, subsequent_mask(tgt.size(1))))[0, -1]
            for token in range(lp.size(0)):
                if token in (PAD, BOS) or (length == limit and token != EOS):
                    continue
                candidates.append((score + lp[token].item(), tokens, token))
        candidates.sort(key=lambda c: -c[0])
        alive = []
        for rank, (score, tokens, token) in enumerate(candidates[: 2 * k]):
            if token == EOS:
                if rank < k:
                    finished.append((score / length_penalty(length, alpha), tokens))
            elif len(alive) < k:
                alive.append((tokens + [token], score))
        if len(finished) >= k or not alive:
            break
        beams = alive
    return max(finished)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("beam_size", [2, 3])
def test_batched_beam_search_follows_the_one_sentence_oracle(seed, beam_size):
    model = sharp_model(seed, vocab=12)
    src, src_mask = random_sources(seed + 10, 12, [2, 6, 4])
    hyps = beam_search(model, src, src_mask, beam_size=beam_size, alpha=0.6, extra_len=4)
    for i, hyp in enumerate(hyps):
        limit = int(src_mask[i].sum()) + 4
        score, tokens = reference_beam_search(model, src[i : i + 1], src_mask[i : i + 1], beam_size, 0.6, limit)
        assert hyp.tokens == tokens and hyp.score == pytest.approx(score, abs=1e-9)


def test_padding_and_start_symbols_are_never_produced():
    model = sharp_model(11, vocab=8)
    with torch.no_grad():
        model.generator.proj.bias[[PAD, BOS]] = 50.0  # a model that loves them
    src, src_mask = random_sources(11, 8, [3, 5])
    for hyp in beam_search(model, src, src_mask, beam_size=3, extra_len=5):
        assert PAD not in hyp.tokens and BOS not in hyp.tokens
    assert any(BOS in t or PAD in t for t in greedy_search(model, src, src_mask, extra_len=5, banned=()))


def test_translations_respect_the_length_limit_and_the_model_positions():
    model = sharp_model(8, max_len=12)
    src, src_mask = random_sources(8, 30, [2, 10])
    for hyp, n in zip(beam_search(model, src, src_mask, beam_size=3, extra_len=50), [3, 11]):
        assert len(hyp.tokens) + 1 <= min(n + 50, 11)


# Averaging and scores


def test_averaging_known_checkpoints_and_refusing_different_models(tmp_path):
    model = make_model(10, 10, N=1, d_model=8, d_ff=16, h=2)
    config = {k: getattr(model.config, k) for k in model.config.__dataclass_fields__}
    paths = []
    for i, value in enumerate([1.0, -2.0, 7.0, 2.0]):
        weights = {name: torch.full_like(t, value) for name, t in model.state_dict().items()}
        paths.append(
            save_checkpoint(
                tmp_path / f"step-{i:06d}.pt",
                {
                    "config": config,
                    "model": weights,
                    "step": i,
                    "src_vocab": 10,
                    "tgt_vocab": 10,
                    "vocab": {},
                    "optimizer": {},
                    "rng": {},
                },
            )
        )
    averaged = average_checkpoints(paths)
    assert all(torch.equal(t, torch.full_like(t, 2.0)) for t in averaged["model"].values())
    assert averaged["step"] == 3 and "optimizer" not in averaged and "rng" not in averaged
    other = make_model(10, 10, N=1, d_model=16, d_ff=16, h=2)
    odd = save_checkpoint(
        tmp_path / "odd.pt",
        {"config": {**config, "d_model": 16}, "model": other.state_dict(), "step": 9, "src_vocab": 10, "tgt_vocab": 10},
    )
    with pytest.raises(Exception, match="odd.pt: its model configuration differs"):
        average_checkpoints([paths[0], odd])


def test_corpus_scores_use_sacrebleu_defaults_and_label_the_tokenized_score():
    refs = ["A man is riding a bike.", "Two dogs play in the snow."]
    perfect = corpus_scores(refs, refs, lang="en")
    assert perfect["bleu"] == 100.0 and perfect["chrf"] == 100.0
    assert "case:mixed" in perfect["bleu_signature"] and "tok:13a" in perfect["bleu_signature"]
    lowered = corpus_scores([r.lower() for r in refs], refs, lang="en")
    assert lowered["bleu"] < 100.0 and lowered["tokenized_lowercase_bleu"] == 100.0
    with pytest.raises(ValueError, match="1 hypotheses for 2 references"):
        corpus_scores(refs[:1], refs)


def test_bleu_into_chinese_counts_characters():
    assert bleu_tokenizer("en-zh") == bleu_tokenizer("en-zh_tw") == "zh"
    assert bleu_tokenizer("zh-en") == bleu_tokenizer("en-de") == "13a"
    refs = ["我累死了。", "他跑了。"]
    perfect = corpus_scores(refs, refs, tokenize="zh")
    assert perfect["bleu"] == 100.0 and "tok:zh" in perfect["bleu_signature"]
    # 13a finds no space in a Chinese sentence: each is one word, with no word pairs to count, and even a perfect
    # translation scores 0; zh counts characters, and one wrong character costs some of the score
    assert corpus_scores(refs, refs)["bleu"] == 0.0
    assert 0.0 < corpus_scores(["我累坏了。", "他跑了。"], refs, tokenize="zh")["bleu"] < 100.0


# Results files


def test_decoding_variant_is_empty_for_the_papers_decoding_and_names_other_settings():
    assert (BEAM_SIZE, ALPHA, EXTRA_LEN) == (4, 0.6, 50) and decoding_variant(4, 0.6, 50) == ""
    assert decoding_variant(1, 0.6, 50) == "-beam1-alpha0.6-extra50"
    others = [(1, 0.6, 50), (4, 0.0, 50), (4, 0.6, 10), (8, 1.0, 50), (4, 0.6, 0)]
    assert len({decoding_variant(*settings) for settings in others} - {""}) == len(others)  # each its own name


def test_record_result_names_the_results_file_with_the_decoding_variant(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps({"recipe": RECIPES["multi30k-tiny"].to_dict(), "device": "cpu"}))
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 10, "train_loss": 3.0, "valid_loss": 3.5}) + "\n")
    (run_dir / "summary.json").write_text(json.dumps({"steps": 10, "wall_time_s": 2.0, "finished": True}))

    def evaluation(beam_size, alpha, extra_len, bleu):
        return {
            "dataset": "multi30k",
            "split": "test",
            "direction": "de-en",
            "beam_size": beam_size,
            "alpha": alpha,
            "extra_len": extra_len,
            "bleu": bleu,
            "hypotheses": ["A dog."],
            "variant": decoding_variant(beam_size, alpha, extra_len),
        }

    papers = record_result(run_dir, evaluation(4, 0.6, 50, 20.0), tmp_path / "results")
    greedy = record_result(run_dir, evaluation(1, 0.6, 50, 15.0), tmp_path / "results")
    assert papers.name == "multi30k-tiny-de-en-test.json"
    assert greedy.name == "multi30k-tiny-de-en-test-beam1-alpha0.6-extra50.json"
    stored = {path.name: json.loads(path.read_text()) for path in (papers, greedy)}
    assert [r["bleu"] for r in stored.values()] == [20.0, 15.0]  # the second did not overwrite the first
    result = stored[greedy.name]
    assert result["recipe"] == "multi30k-tiny" and result["beam_size"] == 1 and result["steps"] == 10
    assert result["metrics"] == [{"step": 10, "train_loss": 3.0, "valid_loss": 3.5}]
    assert "hypotheses" not in result and "variant" not in result


def test_a_recipe_trains_differently_in_all_but_the_checkpoints_it_keeps():
    recipe = RECIPES["multi30k-cpu"]
    assert recipe.trains_differently(recipe.replace(keep_checkpoints=20).to_dict()) == []
    assert recipe.differences(recipe.replace(keep_checkpoints=20).to_dict()) == ["keep_checkpoints"]
    other = recipe.replace(keep_checkpoints=20, dropout=0.0, steps=2200).to_dict()
    assert recipe.trains_differently(other) == ["dropout", "steps"]


RECORDED = sorted((Path(__file__).parent.parent / "results").glob("multi30k-*.json"))


@pytest.mark.parametrize("path", RECORDED, ids=[p.name for p in RECORDED])
def test_recorded_results_come_from_the_recipe_as_it_is(path):
    "A recipe changed after its result was recorded leaves the book and the README quoting another recipe's scores."
    result = json.loads(path.read_text())
    recipe = RECIPES[result["recipe"]].replace(direction=result["direction"])
    assert recipe.trains_differently(result["recipe_settings"]) == [], f"{path.name}: record it again with the recipe"


def test_recorded_results_are_found():
    assert {json.loads(p.read_text())["direction"] for p in RECORDED} == {"de-en", "en-de"}


# The translator and the commands, end to end on a tiny model


def words_checkpoint(path: Path) -> Path:
    "A checkpoint of an untrained model with word vocabularies, as a translation task writes them."
    model = make_model(8, 8, N=1, d_model=16, d_ff=32, h=2)
    words = [*SPECIALS, "ein", "Hund", "a", "dog"]
    return save_checkpoint(
        path,
        {
            "config": dataclasses.asdict(model.config),
            "model": model.state_dict(),
            "step": 1,
            "src_vocab": 8,
            "tgt_vocab": 8,
            "vocab": {"kind": "words", "direction": "de-en", "src": words, "tgt": words},
        },
    )


def test_from_checkpoint_reads_the_stored_vocabulary_through_its_codec(tmp_path):
    path = words_checkpoint(tmp_path / "step-000001.pt")

    class Other(Translator):
        "A subclass: from_checkpoint makes one of it."

    for paths in ([path], [path, path]):  # one checkpoint, or an average
        translator = Other.from_checkpoint(*paths)
        assert type(translator) is Other and isinstance(translator.codec, WordCodec)
        assert translator.direction == "de-en" and len(translator.codec.tgt_vocab) == 8


def test_training_on_multi30k_records_vocabularies_and_a_validation_bleu(tiny_run):
    run_dir, summary = tiny_run
    assert summary["finished"] and "valid_greedy_bleu" in summary and "case:mixed" in summary["bleu_signature"]
    translator = Translator.from_checkpoint(*sorted((run_dir / "checkpoints").glob("*.pt")))  # averaged
    assert translator.direction == "de-en" and len(translator.codec.tgt_vocab) > 1000


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


def test_a_subword_run_translates_and_is_evaluated_on_multi30k(tiny_subword_run, tmp_path, monkeypatch, capsys):
    from annotated_transformer import translation
    from annotated_transformer.cli import main

    run_dir, summary = tiny_subword_run
    assert summary["finished"] and "valid_greedy_bleu" in summary
    translator = Translator.from_checkpoint(*sorted((run_dir / "checkpoints").glob("*.pt")))  # averaged
    assert isinstance(translator.codec, SubwordCodec) and translator.dataset == "multi30k"
    assert translator.direction == "de-en" and len(translator.codec.token_texts()) == RECIPES["multi30k-cpu"].subwords
    assert translator.codec.target_ids(["A  dog."]) == translator.codec.subwords.encode(["A dog."])
    out = translator.translate(["Ein Hund.", "", "Ein Zorblax!"], beam_size=2)
    assert len(out) == 3 and out[1] == "" and all(isinstance(o, str) and "\n" not in o for o in out)
    few = load_multi30k("valid")[:12]  # the command scores Multi30k (not newstest2014), here on 12 sentences
    asked = []
    monkeypatch.setattr(translation, "load_pairs", lambda *args: asked.append(args) or few)
    assert main(["evaluate", "--checkpoint", str(run_dir), "--split", "valid", "--results", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "tokenized, lowercased BLEU" in out
    assert "translating Multi30k valid with beam 4, alpha 0.6, on cpu" in err  # said before the long silent part
    assert asked == [("multi30k", "valid", "de-en")]
    result = json.loads((tmp_path / "multi30k-cpu-de-en-valid.json").read_text())
    assert result["dataset"] == "multi30k" and result["split"] == "valid" and result["recipe_settings"]["subwords"]


def test_translator_defines_empty_long_and_unknown_inputs(tiny_run):
    run_dir, _ = tiny_run
    translator = Translator.from_checkpoint(sorted((run_dir / "checkpoints").glob("*.pt"))[-1], device="cpu")
    long = " ".join(["Hund"] * 100)  # the model has 64 positions
    with pytest.warns(UserWarning, match="1 input.* were cut to fit"):
        out = translator.translate(["Ein Hund.", "", "   ", "Quokkaxyz!", long, "Ein Hund."])
    assert len(out) == 6 and out[1] == out[2] == "" and out[0] == out[5]
    assert all(isinstance(o, str) for o in out)
    with pytest.raises(TypeError, match="list of strings"):
        translator.translate([None])


def test_a_copy_task_checkpoint_translates_its_symbols(tmp_path):
    "Trained by `train` itself: the copy task's vocabulary of symbols makes its checkpoints translators of numbers."
    summary = train(
        RECIPES["copy"].replace(steps=2, eval_every=1, checkpoint_every=1), tmp_path / "copy", progress=False
    )
    assert summary["finished"]
    translator = Translator.from_checkpoint(tmp_path / "copy")
    ids = decode_batches(translator.model, translator.encode(["5 7 7 3"]), banned=translator.banned)[0]
    assert translator.translate(["5 7 7 3", ""]) == [" ".join(map(str, ids)), ""]  # the search's own ids, as numbers


def run_cli(*args, stdin=None, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "annotated_transformer", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


def test_translate_and_evaluate_commands(tiny_run, tmp_path):
    run_dir, _ = tiny_run
    last = sorted((run_dir / "checkpoints").glob("*.pt"))[-1]
    done = run_cli("translate", "--checkpoint", str(last), "--beam-size", "2", stdin="Ein Hund.\n\nZwei Männer.\n")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""
    done = run_cli(
        "evaluate",
        "--checkpoint",
        str(run_dir),
        "--split",
        "valid",
        "--results",
        str(tmp_path / "results"),
        "--hypotheses",
        str(tmp_path / "hyps.txt"),
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    result = json.loads((tmp_path / "results" / "multi30k-cpu-de-en-valid.json").read_text())
    assert f"BLEU = {result['bleu']:.2f}" in done.stdout and result["bleu_signature"] in done.stdout
    assert "case:mixed" in result["bleu_signature"] and "tokenized, lowercased" in done.stdout
    assert summary["evaluation"]["valid"]["bleu"] == result["bleu"]
    assert result["checkpoints"] == [p.name for p in sorted((run_dir / "checkpoints").glob("*.pt"))]  # the last 3
    assert result["steps"] == 40 and result["metrics"] and result["direction"] == "de-en" and result["beam_size"] == 4
    assert len((tmp_path / "hyps.txt").read_text().splitlines()) == 1014
    done = run_cli("evaluate", "--checkpoint", str(last), "--average", "2")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--average needs a run directory" in done.stderr


def test_decode_batches_keeps_the_input_order_and_skips_empty_sources():
    model = sharp_model(9)
    sources = [
        [int(t) for t in torch.randint(3, 30, (n,), generator=torch.Generator().manual_seed(n))] + [EOS]
        for n in (7, 2, 11, 4)
    ]
    sources.insert(2, [])
    batched = decode_batches(model, sources, batch_size=2, beam_size=3, extra_len=5)
    one_by_one = [
        beam_search(model, torch.tensor([s]), torch.ones(1, 1, len(s), dtype=torch.bool), beam_size=3, extra_len=5)[
            0
        ].tokens
        if s
        else []
        for s in sources
    ]
    assert batched == one_by_one and batched[2] == []


def test_from_checkpoint_takes_a_run_directory_as_the_command_line_does(tiny_run):
    from annotated_transformer.checkpoints import checkpoints_to_average

    run_dir, _ = tiny_run
    sources = ["Ein Hund läuft über die Wiese.", "Zwei Männer spielen Fußball."]
    by_folder = Translator.from_checkpoint(run_dir)  # its last checkpoints, as many as its recipe averages (3)
    assert by_folder.translate(sources) == Translator.from_checkpoint(*checkpoints_to_average(run_dir, 3)).translate(
        sources
    )


def test_from_pretrained_reads_a_shared_model_file_and_only_that():
    data = Path(__file__).parent / "data"  # a copy run of two updates, its checkpoint and its exported model file
    shared = Translator.from_pretrained(data / "model-format-1.safetensors", device="cpu")
    assert shared.translate(["5 7 7 3", "12 11"]) == Translator.from_checkpoint(
        data / "checkpoint-format-1.pt", device="cpu"
    ).translate(["5 7 7 3", "12 11"])
    with pytest.raises(ValueError, match=r"checkpoint-format-1.pt: not a model file \(\*.safetensors\); export one"):
        Translator.from_pretrained(data / "checkpoint-format-1.pt")


@pytest.mark.parametrize("beam_size", [1, 4])
def test_scores_that_come_out_nan_stop_the_search_with_an_error(beam_size):
    "Finite weights so large that the output layer overflows: the search would otherwise run to the length limit."
    model = sharp_model(0).float()
    with torch.no_grad():
        model.generator.proj.weight.mul_(1e37)  # finite, but the logits are +-inf and their log-softmax NaN
    assert all(torch.isfinite(p).all() for p in model.parameters())
    src, src_mask = random_sources(1, 30, [4, 9])
    with pytest.raises(FloatingPointError, match="the model's scores are NaN"):
        beam_search(model, src, src_mask, beam_size=beam_size, extra_len=400_000)
