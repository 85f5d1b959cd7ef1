"""The Annotated Transformer: "Attention Is All You Need" as a book of runnable notebooks and the package they export.

This file is written by hand. It re-exports the public names of the generated modules lazily (PEP 562): a name is
imported from its module the first time it is used, so `import annotated_transformer` (and the command line) does
not pay for Altair, spaCy, sacreBLEU or SentencePiece unless something needs them.
"""

import importlib

__version__ = "0.1.0"

# `attention` is both a module and its function. Importing any module of the package that uses it binds the package's
# name `attention` to the module, so the function is bound here first and for good (it costs only torch).
from .attention import attention, subsequent_mask

_MODULES = {  # module: the public names it exports through the package
    "multi_head": ["MultiHeadedAttention", "record_attention"],
    "layers": ["DecoderLayer", "EncoderLayer", "PositionwiseFeedForward", "SublayerConnection"],
    "encoding": ["Embeddings", "LearnedPositionalEmbedding", "PositionalEncoding", "sinusoidal_encoding"],
    "model": ["Decoder", "Encoder", "EncoderDecoder", "Generator", "TransformerConfig", "make_model"],
    "data": [
        "DataError",
        "data_dir",
        "fetch",
        "load_multi30k",
        "load_pairs",
        "load_tatoeba",
        "load_wmt14_test",
        "read_lines",
        "tatoeba_pairs",
    ],
    "checkpoints": [
        "Checkpoint",
        "CheckpointError",
        "TrainingCheckpoint",
        "export_model",
        "load_checkpoint",
        "model_from_checkpoint",
        "save_checkpoint",
    ],
    "recipes": ["RECIPES", "TASKS", "Recipe", "load_task"],
    "runs": ["RunDir", "record_result"],
    "distributed": ["Processes", "accumulation_steps", "check_device", "launch", "process_group"],
    "training": [
        "Batch",
        "LabelSmoothing",
        "accumulate_gradients",
        "greedy_decode",
        "make_optimizer",
        "rate",
        "token_batches",
        "train",
    ],
    "translation": [
        "Hypothesis",
        "IncrementalDecoder",
        "Translator",
        "average_checkpoints",
        "beam_search",
        "corpus_scores",
        "decode_batches",
        "evaluate_translator",
        "greedy_search",
        "length_penalty",
        "multi30k_data",
        "tatoeba_data",
    ],
    "variations": ["PAPER_TABLE3", "Variation", "run_variations", "score_run", "table3_rows", "variations_table"],
    "text": [
        "Subwords",
        "Vocab",
        "WordTokenizer",
        "dataset_subwords",
        "multi30k_subwords",
        "repeats_a_word",
        "text_codec",
    ],
    "cache": ["cached_run", "live_recipe", "run_modules"],
    "charts": ["chart_html", "chart_png", "markdown_table", "use_book_charts", "vendor_javascript"],
    "bench": ["bench_training", "bench_translation", "decoding_time_split", "run_benchmark", "use_path"],
    "measure": ["PeakMemory", "bench_table", "summarize", "write_benchmark"],
    "viz": [
        "CapturedAttention",
        "attention_chart",
        "attention_explorer",
        "attention_overview",
        "capture_attention",
        "head_statistics",
        "head_statistics_chart",
        "uniform_attention",
    ],
    "wmt": [
        "TokenData",
        "clean_pairs",
        "evaluate_wmt14",
        "prepare_wmt14",
        "tokenized_bleu",
    ],
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
