"""The Annotated Transformer: "Attention Is All You Need" as a book of runnable notebooks and the package they export.

This file is written by hand: it only re-exports the public names of the generated modules.
"""
__version__ = "0.1.0"

from .charts import chart_html, use_book_charts, vendor_javascript
from .attention import attention, subsequent_mask
from .multi_head import MultiHeadedAttention, record_attention
from .layers import DecoderLayer, EncoderLayer, PositionwiseFeedForward, SublayerConnection
from .encoding import Embeddings, LearnedPositionalEmbedding, PositionalEncoding, sinusoidal_encoding
from .model import Decoder, Encoder, EncoderDecoder, Generator, TransformerConfig, make_model
from .training import (Batch, CheckpointError, LabelSmoothing, Recipe, RECIPES, TASKS, accumulate_gradients,
                       accumulation_steps, greedy_decode, load_checkpoint, make_optimizer, model_from_checkpoint, rate,
                       save_checkpoint, token_batches, train)
from .translation import (DataError, Hypothesis, IncrementalDecoder, Translator, Vocab, WordTokenizer,
                          average_checkpoints, beam_search, cached_run, corpus_scores, decode_batches,
                          evaluate_translator, fetch, greedy_search, length_penalty, load_multi30k)
from .bench import (bench_table, bench_training, bench_translation, decoding_time_split, run_benchmark, use_path,
                    write_benchmark)
from .viz import (CapturedAttention, attention_chart, attention_explorer, attention_overview, capture_attention,
                  head_statistics, head_statistics_chart, uniform_attention)
from .wmt import (Subwords, SubwordTranslator, TokenData, clean_pairs, evaluate_wmt14, launch, load_wmt14_test,
                  prepare_wmt14, process_group, tokenized_bleu)
