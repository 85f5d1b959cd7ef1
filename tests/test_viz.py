"""Attention visualisation (book/11_attention_heads.ipynb): capturing the weights, the charts, and the head statistics."""

import copy
import json
import math
import re

import altair as alt
import pytest
import torch

from annotated_transformer import MultiHeadedAttention, Translator, make_model
from annotated_transformer.attention import subsequent_mask
from annotated_transformer.lib.tokenizers import Subwords
from annotated_transformer.lib.translate import decode_batches
from annotated_transformer.lib.viz import (
    KINDS,
    STATISTICS,
    CapturedAttention,
    attention_chart,
    attention_explorer,
    attention_overview,
    capture_attention,
    head_statistics,
    head_statistics_chart,
    uniform_attention,
)
from annotated_transformer.training import BOS, SPECIALS

GERMAN = "ein Mann mit Hund läuft über die Straße . Anna und Berlin 2 zwei Frauen".split()


ENGLISH = "a man with dog runs across the street . Anna and Berlin 2 two women walks".split()


@pytest.fixture(scope="module")
def translator():
    torch.manual_seed(0)
    model = make_model(
        len(SPECIALS) + len(GERMAN), len(SPECIALS) + len(ENGLISH), N=2, d_model=32, d_ff=64, h=4, share_embeddings=False
    )
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)  # sharper than at initialisation, so that weights differ from head to head
    vocab = {"kind": "words", "direction": "de-en", "src": list(SPECIALS) + GERMAN, "tgt": list(SPECIALS) + ENGLISH}
    return Translator(model, vocab, device="cpu", batch_size=2)


SOURCES = ["Ein Mann mit Hund läuft über die Straße.", "Anna und zwei Frauen.", "Berlin"]


TARGETS = ["A man with dog runs across the street.", "Anna and two women.", "Berlin"]


def test_capture_shapes_distributions_masks_and_padding(translator):
    captured = capture_attention(translator, SOURCES, TARGETS)
    config = translator.model.config
    n_src, n_tgt = max(map(len, captured.src_tokens)), max(map(len, captured.tgt_tokens))
    assert captured.weights["encoder"].shape == (3, config.N, config.h, n_src, n_src)
    assert captured.weights["decoder"].shape == (3, config.N, config.h, n_tgt, n_tgt)
    assert captured.weights["cross"].shape == (3, config.N, config.h, n_tgt, n_src)
    for i in range(3):
        s, t = len(captured.src_tokens[i]), len(captured.tgt_tokens[i])
        pair = captured.pair(i)
        assert {k: tuple(w.shape[-2:]) for k, w in pair.items()} == {
            "encoder": (s, s),
            "decoder": (t, t),
            "cross": (t, s),
        }
        for w in pair.values():
            torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
        assert (pair["decoder"].triu(1) == 0).all()
        # Everything outside the pair's real positions is zero: padded keys and padded queries alike.
        for kind, w in captured.weights.items():
            inside = w[i].clone()
            rows, cols = pair[kind].shape[-2:]
            inside[..., :rows, :cols] = 0
            assert (inside == 0).all(), kind
    assert captured.src_tokens[1] == ["Anna", "und", "zwei", "Frauen", ".", "</s>"]
    assert captured.src_tokens[0][0] == "<unk>"  # "Ein": the vocabulary only has "ein"
    assert captured.tgt_tokens[1] == ["Anna", "and", "two", "women", ".", "</s>"]
    assert captured.labels(1, "cross") == (["<s>", "Anna", "and", "two", "women", "."], captured.src_tokens[1])


def test_capture_equals_the_models_own_attention_and_leaves_no_trace(translator):
    "Batched and padded, the weights are those of each pair alone, and those of the book's equation (1)."
    translator = copy.deepcopy(translator)
    model = translator.model.double().train()  # float64: sums of a different length round alike
    together = capture_attention(translator, SOURCES, TARGETS)
    assert model.training  # restored
    assert all(m.attn is None for m in model.modules() if isinstance(m, MultiHeadedAttention))
    for i in range(3):
        alone = capture_attention(translator, SOURCES[i : i + 1], TARGETS[i : i + 1]).pair(0)
        for kind in KINDS:
            torch.testing.assert_close(together.pair(i)[kind], alone[kind])
    # The first encoder layer's weights, recomputed by hand from its projections.
    model.eval()
    src = torch.tensor([translator.encode(SOURCES[:1])[0]])
    mha = model.encoder.layers[0].self_attn
    assert not model.config.norm_first  # post-norm: the first layer's attention reads the embeddings themselves
    x = model.src_embed(src)
    q, k = mha.split_heads(mha.w_q(x)), mha.split_heads(mha.w_k(x))
    expected = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(mha.d_k), -1)[0]
    torch.testing.assert_close(together.pair(0)["encoder"][0], expected.float())
    # The decoder's first layer reads <s> and the target without its last token (teacher forcing), masked.
    ids = translator.codec.tgt_vocab.encode(translator.codec.tgt_tokenizer(TARGETS[:1])[0])
    reads = torch.tensor([[BOS] + ids])  # <s> y1 ... yn: n + 1 = len(y + </s>)
    mha = model.decoder.layers[0].self_attn
    y = model.tgt_embed(reads)
    q, k = mha.split_heads(mha.w_q(y)), mha.split_heads(mha.w_k(y))
    scores = (q @ k.transpose(-2, -1) / math.sqrt(mha.d_k)).masked_fill(~subsequent_mask(reads.size(1)), float("-inf"))
    torch.testing.assert_close(together.pair(0)["decoder"][0], torch.softmax(scores, -1)[0].float())
    assert together.tgt_tokens[0] == translator.codec.tgt_vocab.decode(ids) + ["</s>"]


def test_capture_of_the_translators_own_output(translator):
    captured = capture_attention(translator, SOURCES, beam_size=2)
    own = decode_batches(translator.model, translator.encode(SOURCES), translator.batch_size, beam_size=2)
    assert captured.tgt_tokens == [translator.codec.tgt_vocab.decode(ids) + ["</s>"] for ids in own]


def test_capture_refuses_bad_input(translator):
    with pytest.raises(ValueError, match="non-empty source"):
        capture_attention(translator, [])
    with pytest.raises(ValueError, match="non-empty source"):
        capture_attention(translator, ["Ein Mann.", "  "])
    with pytest.raises(ValueError, match="one target per source"):
        capture_attention(translator, SOURCES, TARGETS[:2])


def test_attention_chart_menus_data_and_errors(translator):
    pair = capture_attention(translator, SOURCES[:1], TARGETS[:1]).pair(0)
    w = pair["cross"]
    rows, cols = ["r"] * w.shape[-2], ["c"] * w.shape[-1]
    spec = attention_chart(w, rows, cols, title="x", name="cross").to_dict()  # to_dict validates the schema
    assert len(spec["data"]["values"]) == w.numel()
    menus = {p["name"]: p["bind"] for p in spec["params"]}
    assert menus["cross_layer"]["input"] == "select" and menus["cross_layer"]["options"] == [1, 2]
    assert menus["cross_head"]["options"] == [1, 2, 3, 4]
    one = attention_chart(w[1, 2], rows, cols).to_dict()
    assert "params" not in one and len(one["data"]["values"]) == w[1, 2].numel()
    assert one["data"]["values"][5]["weight"] == round(float(w[1, 2].flatten()[5]), 3)
    with pytest.raises(ValueError, match="row and column tokens"):
        attention_chart(w, rows[1:], cols)
    with pytest.raises(ValueError, match="must be"):
        attention_chart(w[0], rows, cols)
    explorer = attention_explorer(translator, SOURCES[0], TARGETS[0]).to_dict()
    assert len(explorer["vconcat"]) == 3
    names = {p["name"] for p in explorer["params"]}
    assert names == {f"{kind}_{menu}" for kind in KINDS for menu in ("layer", "head")}
    overview = attention_overview(w).to_dict()
    assert overview["facet"]["row"]["field"] == "layer" and len(overview["data"]["values"]) == w.numel()


def _hand_made(weights: dict, src_tokens, tgt_tokens) -> CapturedAttention:
    return CapturedAttention({k: v[None, None, None] for k, v in weights.items()}, [src_tokens], [tgt_tokens])


def test_head_statistics_on_known_weights():
    src = ["Anna", "sieht", "Berlin", "</s>"]  # 4 source positions
    tgt = ["Anna", "sees", "Berlin", "</s>"]  # the decoder predicts these; it reads <s> Anna sees Berlin
    previous = torch.eye(4).roll(-1, 1).tril()  # every query on the position before it (row 0 on itself)
    previous[0, 0] = 1.0
    cross = torch.zeros(4, 4)
    cross[0, 0], cross[1, 3], cross[2, 2], cross[3, 1] = 1.0, 1.0, 1.0, 1.0  # "Anna" and "Berlin" aligned
    stats = {
        r["kind"]: r
        for r in head_statistics(_hand_made({"encoder": torch.eye(4), "decoder": previous, "cross": cross}, src, tgt))
    }
    enc, dec, crs = stats["encoder"], stats["decoder"], stats["cross"]
    assert enc["entropy"] == 0 and enc["same"] == 1 and enc["previous"] == 0 and enc["distance"] == 0
    assert enc["boundary"] == 0.25 and enc["uniform_entropy"] == 2.0
    assert dec["previous"] == 0.75 and dec["same"] == 0.25 and dec["distance"] == 0.75 and "next" not in dec
    assert dec["boundary"] == 0.5  # rows 0 and 1 look at <s> (position 0)
    assert dec["uniform_entropy"] == round(sum(math.log2(n) for n in (1, 2, 3, 4)) / 4, 4)
    assert crs["alignment"] == 1.0 and crs["alignment_rows"] == 2 and crs["boundary"] == 0.25
    assert set(crs) == {
        "kind",
        "layer",
        "head",
        "entropy",
        "uniform_entropy",
        "boundary",
        "alignment",
        "alignment_rows",
    }
    assert set(STATISTICS) >= set(enc) - {"kind", "layer", "head"}


def test_uniform_baseline_is_uniform_over_what_each_query_may_see(translator):
    captured = capture_attention(translator, SOURCES, TARGETS)
    uniform = uniform_attention(captured)
    for i in range(3):
        pair = uniform.pair(i)
        for kind, w in pair.items():
            torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
        t = len(captured.tgt_tokens[i])
        torch.testing.assert_close(
            pair["decoder"][0, 0], subsequent_mask(t)[0].float() / torch.arange(1, t + 1)[:, None]
        )
    for r in head_statistics(uniform):
        assert r["entropy"] == pytest.approx(r["uniform_entropy"], abs=2e-4)


def test_head_statistics_chart_has_a_menu_of_measures(translator):
    stats = head_statistics(capture_attention(translator, SOURCES, TARGETS))
    assert len(stats) == 3 * 2 * 4
    spec = head_statistics_chart(stats).to_dict()
    (param,) = spec["params"]
    assert param["bind"]["options"] == [n for n in STATISTICS if n != "uniform_entropy"]
    assert {v["statistic"] for v in spec["data"]["values"]} == set(param["bind"]["options"])


def test_capture_reads_a_subword_translators_pieces():
    subwords = Subwords.train([" ".join(GERMAN), " ".join(ENGLISH)] * 20, 300)
    torch.manual_seed(0)
    model = make_model(len(subwords), len(subwords), N=1, d_model=32, d_ff=64, h=4)
    vocab = {"kind": "sentencepiece", "dataset": "multi30k", "direction": "de-en", "model": subwords.model}
    translator = Translator(model, vocab, device="cpu", batch_size=2)
    captured = capture_attention(translator, SOURCES, TARGETS)
    texts = translator.codec.token_texts()
    assert texts[: len(SPECIALS)] == list(SPECIALS)
    for i, (source, target) in enumerate(zip(SOURCES, TARGETS)):
        assert captured.src_tokens[i][-1] == captured.tgt_tokens[i][-1] == "</s>"
        # the labels are the pieces, ▁ marking a word's start: joined, they spell the sentence
        assert "".join(captured.src_tokens[i][:-1]).replace("▁", " ").strip() == source
        assert "".join(captured.tgt_tokens[i][:-1]).replace("▁", " ").strip() == target
        rows = captured.pair(i)["cross"].sum(-1)  # each target position spreads its attention over the real pieces
        torch.testing.assert_close(rows, torch.ones_like(rows))


def test_a_pairs_chart_leaves_its_padding_out_and_labels_its_tokens(translator):
    captured = capture_attention(translator, SOURCES, TARGETS)
    spec = captured.chart(2, "cross").to_dict()  # "Berlin": the shortest pair, padded in the batch
    rows, cols = captured.labels(2, "cross")
    assert (len(rows), len(cols)) == (len(captured.tgt_tokens[2]), len(captured.src_tokens[2])) == (2, 2)
    records = spec["data"]["values"] if "values" in spec.get("data", {}) else next(iter(spec["datasets"].values()))
    assert max(r["query"] for r in records) == len(rows) - 1 and max(r["key"] for r in records) == len(cols) - 1
    assert spec["title"] == "Encoder-decoder attention" and (spec["width"], spec["height"]) == (36, 36)
    assert json.dumps(cols) in spec["encoding"]["x"]["axis"]["labelExpr"]


def test_a_chart_saved_as_html_draws_offline_and_as_pictures(tmp_path):
    from annotated_transformer.lib.viz import save_chart

    chart = alt.Chart(alt.Data(values=[{"x": 1, "y": 2}])).mark_point().encode(x="x:Q", y="y:Q")
    page = save_chart(chart, tmp_path / "chart.html").read_text()
    assert "vegaEmbed" in page and not re.findall(r"<script[^>]*\bsrc=", page)  # the libraries are inside the page
    assert save_chart(chart.to_dict(), tmp_path / "chart.png").read_bytes().startswith(b"\x89PNG")
    assert save_chart(chart, tmp_path / "chart.svg").read_text().lstrip().startswith("<svg")
    assert save_chart(chart, tmp_path / "more" / "CHART.SVG").read_text().lstrip().startswith("<svg")  # made for it
    with pytest.raises(ValueError, match=r"chart.pdf: a chart is saved as .html, .png, .svg"):
        save_chart(chart, tmp_path / "chart.pdf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chart.html", "chart.png", "chart.svg", "more"]


def test_saving_a_chart_without_vl_convert_names_the_extra(tmp_path, monkeypatch):
    import sys

    from annotated_transformer.lib.viz import save_chart

    monkeypatch.setitem(sys.modules, "vl_convert", None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'annotated-transformer\[viz\]'"):
        save_chart({"mark": "point"}, tmp_path / "chart.png")
    assert not list(tmp_path.iterdir())
