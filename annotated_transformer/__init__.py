"""The Annotated Transformer: "Attention Is All You Need" as a book of runnable notebooks and the package they export.

This file is written by hand. It re-exports the public names of the paper's modules and of the library lazily
(PEP 562): a name is imported from its module the first time it is used, so `import annotated_transformer` (and the
command line) does not pay for Altair, spaCy, sacreBLEU or SentencePiece unless something needs them.
"""

import importlib

__version__ = "0.1.0"

# `attention` is both a module and its function. Importing any module of the package that uses it binds the package's
# name `attention` to the module, so the function is bound here first and for good (it costs only torch).
from .attention import attention, subsequent_mask

_MODULES = {  # module: the public names it exports through the package
    # The paper, exported from the book's chapters.
    "multi_head": ["MultiHeadedAttention", "explicit_attention", "record_attention"],
    "layers": ["DecoderLayer", "EncoderLayer", "PositionwiseFeedForward", "SublayerConnection"],
    "encoding": ["Embeddings", "EmbeddingsWithPositions", "LearnedPositionalEmbedding", "PositionalEncoding",
                 "sinusoidal_encoding"],
    "model": ["Decoder", "Encoder", "EncoderDecoder", "Generator", "TransformerConfig", "make_model"],
    "training": [
        "Batch",
        "LabelSmoothing",
        "accumulate_gradients",
        "copy_task",
        "greedy_decode",
        "make_optimizer",
        "optimizer_step",
        "padding_mask",
        "rate",
        "token_batches",
        "train_model",
    ],
    "decoding": ["DecoderCache", "Hypothesis", "average_weights", "beam_search", "length_penalty"],
    # The library that runs the paper at scale.
    "lib.downloads": ["DataError", "data_dir", "fetch"],
    "lib.datasets": ["load_multi30k", "load_pairs", "load_tatoeba", "read_lines", "tatoeba_pairs"],
    "lib.wmt14_files": ["load_wmt14_test"],
    "lib.tokenizers": ["Subwords", "Vocab", "WordTokenizer", "dataset_subwords", "multi30k_subwords"],
    "lib.vocab": ["text_codec"],
    "lib.recipes": ["RECIPES", "Recipe", "Task"],
    "lib.tasks": ["TASKS", "load_task"],
    "lib.checkpoints": [
        "Checkpoint",
        "CheckpointError",
        "TrainingCheckpoint",
        "average_checkpoints",
        "load_checkpoint",
        "model_from_checkpoint",
        "save_checkpoint",
    ],
    "lib.pretrained": ["Transformer", "read_model", "save_pretrained"],
    "lib.runs": ["RunDir"],
    "lib.results": ["record_result"],
    "lib.processes": ["Processes", "accumulation_steps", "launch", "process_group"],
    "lib.devices": ["check_device"],
    "lib.trainer": ["train"],
    "lib.translate": ["Translator", "decode_batches"],
    "lib.evaluate": ["corpus_scores", "evaluate_translator", "repeats_a_word"],
    "lib.variations": ["PAPER_TABLE3", "Variation", "run_variations", "score_run", "table3_rows", "variations_table"],
    "lib.bench": ["bench_training", "bench_translation", "decoding_time_split", "run_benchmark"],
    "lib.measure": ["PeakMemory", "bench_table", "summarize", "write_benchmark"],
    "lib.viz": [
        "CapturedAttention",
        "attention_chart",
        "attention_explorer",
        "attention_overview",
        "capture_attention",
        "head_statistics",
        "head_statistics_chart",
        "save_chart",
        "uniform_attention",
    ],
    "lib.wmt": ["TokenData", "clean_pairs", "evaluate_wmt14", "prepare_wmt14", "tokenized_bleu"],
}
_HOME = {name: module for module, names in _MODULES.items() for name in names}

__all__ = ["__version__", "attention", "subsequent_mask", *_HOME]


def __getattr__(name: str):
    "A public name, imported from its module on first use (and kept, so that this runs once per name)."
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
