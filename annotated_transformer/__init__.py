"""The Annotated Transformer: "Attention Is All You Need" as a book of runnable notebooks and the package they export.

This file is written by hand: it only re-exports the public names of the generated modules.
"""
__version__ = "0.1.0"

from .attention import attention, subsequent_mask
from .multi_head import MultiHeadedAttention, record_attention
from .layers import DecoderLayer, EncoderLayer, PositionwiseFeedForward, SublayerConnection
from .encoding import Embeddings, LearnedPositionalEmbedding, PositionalEncoding, sinusoidal_encoding
from .model import Decoder, Encoder, EncoderDecoder, Generator, TransformerConfig, make_model
from .data import DataError, data_dir, fetch, load_multi30k, read_lines
from .runs import (RECIPES, TASKS, CheckpointError, Recipe, RunDir, load_checkpoint,
                   model_from_checkpoint, record_result, save_checkpoint)
from .distributed import accumulation_steps, launch, process_group
from .training import (Batch, LabelSmoothing, accumulate_gradients, cached_run, greedy_decode, make_optimizer, rate,
                       token_batches, train)
from .translation import (Hypothesis, IncrementalDecoder, Translator, Vocab, WordTokenizer, average_checkpoints, beam_search,
                          corpus_scores, decode_batches, evaluate_translator, greedy_search, length_penalty)
from .charts import chart_html, use_book_charts, vendor_javascript
from .bench import (bench_table, bench_training, bench_translation, decoding_time_split, run_benchmark, use_path,
                    write_benchmark)
from .viz import (CapturedAttention, attention_chart, attention_explorer, attention_overview, capture_attention,
                  head_statistics, head_statistics_chart, uniform_attention)
from .wmt import (Subwords, SubwordTranslator, TokenData, clean_pairs, evaluate_wmt14, load_wmt14_test,
                  prepare_wmt14, tokenized_bleu)
