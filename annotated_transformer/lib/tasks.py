"""The data of each task a recipe can name, loaded by `load_task`: the copy task, translation on Multi30k or
Tatoeba (words or subwords, either direction), and WMT14 (prepared by `wmt.prepare_wmt14`)."""

from ..training import BOS, EOS, copy_exact_match, copy_task
from .datasets import load_pairs, parallel_directions
from .evaluate import greedy_validation_bleu
from .recipes import Recipe, Task
from .tokenizers import Vocab, dataset_subwords, tokenized_multi30k
from .vocab import subwords_vocab, symbols_vocab, words_vocab
from .wmt import wmt14_data


def copy_data(recipe: Recipe) -> Task:
    "The copy task: 20,000 training sequences, and validation and held-out sequences never seen in training."
    vocab = 13
    train = copy_task(20_000, vocab, seed=recipe.seed)
    held_out = copy_task(500, vocab, seed=recipe.seed + 2, exclude=train)  # never seen in training
    return Task(train=train, valid=copy_task(500, vocab, seed=recipe.seed + 1, exclude=train),
                src_vocab=vocab, tgt_vocab=vocab, vocab=symbols_vocab(range(3, vocab)),
                evaluate=lambda model, device: {"exact_match": copy_exact_match(model, held_out, device)})


def translation_task(recipe: Recipe, dataset: str, evaluation) -> Task:
    """The sentence pairs of `dataset` (a name in `PARALLEL_DATA`) as a `Task` of token ids, in `recipe.direction`
    (default: the data set's first). Vocabularies come from the training split only: with `recipe.subwords`, one
    SentencePiece vocabulary of that many pieces for both languages (`dataset_subwords`; the model then shares one
    embedding matrix, §3.4), or one of that many per language with `recipe.shared_subwords` False; without, a word
    vocabulary per language (words seen `recipe.min_freq` times or more; Multi30k only). `evaluation(vocab, valid_pairs)` makes the task's final check, a callable(model, device) -> dict."""
    direction = recipe.direction or parallel_directions(dataset)[0]
    if not recipe.subwords and dataset != "multi30k":
        raise ValueError(f"the {dataset} task needs subwords (a SentencePiece vocabulary, e.g. subwords=4000): "
                         "word vocabularies are Multi30k's only")
    raw = {split: load_pairs(dataset, split, direction) for split in ("train", "valid")}
    if recipe.subwords:
        if recipe.shared_subwords:
            sides = [dataset_subwords(dataset, recipe.subwords)] * 2  # source, target
        else:
            sides = [dataset_subwords(dataset, recipe.subwords, language) for language in direction.split("-")]
        ids = {split: [subwords.encode([" ".join(x.split()) for x in side]) for subwords, side in zip(sides, zip(*pairs))]
               for split, pairs in raw.items()}
        vocab = subwords_vocab(dataset, direction, sides[0], None if recipe.shared_subwords else sides[1])
        sizes = (len(sides[0]), len(sides[1]))
    else:
        tokens = {split: tokenized_multi30k(split, direction) for split in ("train", "valid")}
        src_vocab, tgt_vocab = (Vocab.build(side, recipe.min_freq) for side in tokens["train"])
        ids = {split: [[src_vocab.encode(s) for s in src], [tgt_vocab.encode(t) for t in tgt]]
               for split, (src, tgt) in tokens.items()}
        vocab = words_vocab(dataset, direction, src_vocab, tgt_vocab)
        sizes = (len(src_vocab), len(tgt_vocab))
    limit = recipe.model.max_len - 1  # positions: the target needs room for <s> ... </s>
    pairs = {split: [(s[:limit - 1] + [EOS], [BOS] + t[:limit - 1] + [EOS]) for s, t in zip(*ids[split])] for split in ids}
    return Task(train=pairs["train"], valid=pairs["valid"], src_vocab=sizes[0], tgt_vocab=sizes[1], vocab=vocab,
                evaluate=evaluation(vocab, raw["valid"]))


def multi30k_data(recipe: Recipe) -> Task:
    """The "multi30k" task: Multi30k's sentence pairs as token ids (`translation_task`), in `recipe.direction`
    (default "de-en"), with words or subwords (`recipe.subwords`). The final evaluation is greedy BLEU on the
    validation split; `annotated-transformer evaluate` does the full evaluation (beam, averaging, test split)."""
    return translation_task(recipe, "multi30k", greedy_validation_bleu)


def tatoeba_data(recipe: Recipe) -> Task:
    "The \"tatoeba\" task: Tatoeba's Chinese-English pairs as `multi30k_data` makes Multi30k's (default \"zh-en\")."
    return translation_task(recipe, "tatoeba", greedy_validation_bleu)


# Task name -> the function that loads its data (recipe -> `Task`).
TASKS = {"copy": copy_data, "multi30k": multi30k_data, "tatoeba": tatoeba_data, "wmt14": wmt14_data}


def load_task(recipe: Recipe) -> Task:
    "The data of `recipe.task`, from the loader `TASKS` names for it."
    if recipe.task not in TASKS:
        raise ValueError(f"unknown task {recipe.task!r}; the tasks are {', '.join(sorted(TASKS))}")
    return TASKS[recipe.task](recipe)
