"""Looking at attention (the paper's Figures 3–5): every layer's and head's weights of a translator captured on demand,
drawn as interactive Altair charts with the tokens as labels, measured head by head, and saved as files."""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..attention import subsequent_mask
from ..decoding import BEAM_SIZE
from ..multi_head import MultiHeadedAttention, record_attention
from ..training import BOS, EOS, PAD, pad_sequences, padding_mask
from .files import atomic_file
from .translate import Translator, decode_batches

if TYPE_CHECKING:  # Altair is imported where a chart is drawn; here it only names the charts' types
    import altair as alt


KINDS = {"encoder": "Encoder self-attention", "decoder": "Decoder self-attention", "cross": "Encoder-decoder attention"}


@dataclass
class CapturedAttention:
    """The attention weights of every layer and head of a translator for a batch of sentence pairs.

    `weights[kind]` is a (batch, layers, heads, queries, keys) tensor for each kind of `KINDS`: "encoder"
    (source × source), "decoder" (target × target) and "cross" (target queries × source keys), zero wherever
    a query or a key is padding. `src_tokens[i]` are the source tokens of pair i, ending in `</s>`;
    `tgt_tokens[i]` the target tokens the decoder *predicts*, ending in `</s>`. Query row t of the decoder's
    attentions reads `<s>` and the tokens before position t, and predicts `tgt_tokens[i][t]`.
    """

    weights: dict[str, Tensor]
    src_tokens: list[list[str]]
    tgt_tokens: list[list[str]]

    def pair(self, i: int) -> dict[str, Tensor]:
        "The weights of pair i without padding: kind -> (layers, heads, queries, keys)."
        s, t = len(self.src_tokens[i]), len(self.tgt_tokens[i])
        sizes = {"encoder": (s, s), "decoder": (t, t), "cross": (t, s)}
        return {kind: w[i, :, :, :sizes[kind][0], :sizes[kind][1]] for kind, w in self.weights.items()}

    def labels(self, i: int, kind: str) -> tuple[list[str], list[str]]:
        "The row (query) and column (key) labels of pair i for one kind: decoder rows read <s> y1 ... y(n-1)."
        src, reads = self.src_tokens[i], ["<s>"] + self.tgt_tokens[i][:-1]
        return {"encoder": (src, src), "decoder": (reads, reads), "cross": (reads, src)}[kind]

    def chart(self, i: int, kind: str, **options) -> "alt.Chart":
        "`attention_chart` of pair i's attention of one kind, its padding left out and its tokens as labels."
        return attention_chart(self.pair(i)[kind], *self.labels(i, kind), **{"title": KINDS[kind], "name": kind,
                                                                             **options})


@torch.no_grad()
def capture_attention(translator: Translator, sources: list[str], targets: list[str] | None = None,
                      beam_size: int = BEAM_SIZE) -> CapturedAttention:
    """Run `translator`'s model once over sentence pairs inside `record_attention()` and keep every head's weights.

    The sources are German (or whatever the translator reads) strings. The targets are the translations the
    decoder is fed, teacher-forced: by default the translator's own (beam search with `beam_size`), or strings
    given in `targets` (for example references). Outside this function the model keeps no weights: training
    and decoding run the fast path.
    """
    sources = list(sources)
    if not sources or any(not isinstance(s, str) or not s.strip() for s in sources):
        raise ValueError("capture_attention needs a list of non-empty source sentences")
    src = translator.encode(sources)
    if targets is None:
        tgt = [ids + [EOS] for ids in decode_batches(translator.model, src, translator.batch_size, beam_size,
                                                                        banned=translator.banned)]
    else:
        targets = list(targets)
        if len(targets) != len(sources):
            raise ValueError(f"{len(sources)} sources but {len(targets)} targets: give one target per source")
        limit = translator.model.config.max_len - 1
        tgt = [ids[:limit - 1] + [EOS] for ids in translator.codec.target_ids(targets)]
    model, was_training = translator.model, translator.model.training
    device = next(model.parameters()).device
    src_ids = pad_sequences(src).to(device)                                # (batch, S)
    reads = pad_sequences([[BOS] + t[:-1] for t in tgt]).to(device)       # (batch, T): <s> y1 ... y(n-1)
    src_mask = padding_mask(src_ids)                                      # (batch, 1, S)
    tgt_mask = padding_mask(reads) & subsequent_mask(reads.size(1)).to(device)  # (batch, T, T)
    model.eval()
    try:
        with record_attention():
            model.decode(model.encode(src_ids, src_mask), src_mask, reads, tgt_mask)
    finally:
        model.train(was_training)
    src_real, tgt_real = (src_ids != PAD).float(), (reads != PAD).float()
    rows = {"encoder": src_real, "decoder": tgt_real, "cross": tgt_real}
    stacks = {"encoder": [layer.self_attn.attn for layer in model.encoder.layers],
              "decoder": [layer.self_attn.attn for layer in model.decoder.layers],
              "cross": [layer.src_attn.attn for layer in model.decoder.layers]}
    # (batch, layers, heads, queries, keys); padded queries attend somewhere too, so their rows are zeroed.
    weights = {kind: torch.stack(ws, 1).float().cpu() * rows[kind].cpu()[:, None, None, :, None]
               for kind, ws in stacks.items()}
    for module in model.modules():  # the model keeps no copy: the weights belong to the caller now
        if isinstance(module, MultiHeadedAttention):
            module.attn = None
    src_texts, tgt_texts = translator.codec.token_texts(source=True), translator.codec.token_texts()
    return CapturedAttention(weights, [[src_texts[i] for i in s] for s in src], [[tgt_texts[i] for i in t] for t in tgt])


def _records(weights: Tensor) -> list[dict]:
    "(layers, heads, queries, keys) -> one record per cell, positions from 0 and layers and heads from 1."
    layers, heads, n_q, n_k = weights.shape
    values = weights.double().round(decimals=3).tolist()  # float64: 0.011, not 0.010999999940395355
    return [{"layer": l + 1, "head": h + 1, "query": q, "key": k, "weight": values[l][h][q][k]}
            for l in range(layers) for h in range(heads) for q in range(n_q) for k in range(n_k)]


def _token_axis(tokens: list[str], title: str, **kwargs) -> "alt.Axis":
    "An axis of positions labelled with their tokens (positions, not words, are the keys: words repeat)."
    import altair as alt

    return alt.Axis(title=title, labelExpr=f"{json.dumps(tokens)}[datum.value]", labelOverlap=False, **kwargs)


def attention_chart(weights: Tensor, row_tokens: list[str], col_tokens: list[str], title: str = "",
                    name: str = "attention", cell: int = 18) -> "alt.Chart":
    """An interactive heat map of attention weights: one row per query token, one column per key token.

    `weights` is (queries, keys) for one head, or (layers, heads, queries, keys): then two drop-down menus pick
    the layer and the head (Altair parameters bound to widgets, so the choice works in a static HTML page
    without a kernel). The colour scale is fixed to [0, 1], so heads can be compared; the tooltip gives the
    two tokens and the weight. `name` prefixes the parameters' names: charts concatenated together need
    different ones.
    """
    import altair as alt

    if weights.dim() == 2:
        weights = weights[None, None]
    if weights.dim() != 4:
        raise ValueError(f"weights must be (queries, keys) or (layers, heads, queries, keys), got {tuple(weights.shape)}")
    layers, heads, n_q, n_k = weights.shape
    if (n_q, n_k) != (len(row_tokens), len(col_tokens)):
        raise ValueError(f"weights of {n_q} queries × {n_k} keys need as many row and column tokens, "
                         f"got {len(row_tokens)} and {len(col_tokens)}")
    chart = alt.Chart(alt.Data(values=_records(weights)), title=title).mark_rect().encode(
        x=alt.X("key:O", axis=_token_axis(col_tokens, "key (attended to)", labelAngle=-50, orient="top")),
        y=alt.Y("query:O", axis=_token_axis(row_tokens, "query (attending)")),
        color=alt.Color("weight:Q", scale=alt.Scale(domain=[0, 1], scheme="blues")),
        tooltip=[alt.Tooltip("query_token:N", title="query"), alt.Tooltip("key_token:N", title="key"),
                 alt.Tooltip("weight:Q", format=".3f")],
    ).transform_calculate(
        query_token=f"{json.dumps(row_tokens)}[datum.query]", key_token=f"{json.dumps(col_tokens)}[datum.key]",
    ).properties(width=cell * n_k, height=cell * n_q)
    if layers * heads == 1:
        return chart
    layer = alt.param(name=f"{name}_layer", value=1,
                      bind=alt.binding_select(options=list(range(1, layers + 1)), name=f"{title or name}: layer "))
    head = alt.param(name=f"{name}_head", value=1,
                     bind=alt.binding_select(options=list(range(1, heads + 1)), name="head "))
    return chart.add_params(layer, head).transform_filter(
        (alt.datum.layer == layer) & (alt.datum.head == head))


def attention_explorer(translator: Translator, sentence: str, target: str | None = None,
                       beam_size: int = BEAM_SIZE) -> "alt.VConcatChart":
    """The three kinds of attention of `translator` for one sentence, each with its own layer and head menus.

    The decoder reads `target` if given, else the translator's own translation (beam search). Use it in
    Jupyter: `attention_explorer(Translator.from_checkpoint("runs/multi30k-cpu/checkpoints/..."), "Ein Hund.")`.
    """
    import altair as alt

    captured = capture_attention(translator, [sentence], None if target is None else [target], beam_size)
    weights = captured.pair(0)
    return alt.vconcat(*(attention_chart(weights[kind], *captured.labels(0, kind), title=title, name=kind)
                         for kind, title in KINDS.items())).resolve_scale(color="shared")


def attention_overview(weights: Tensor, title: str = "", cell: int = 5) -> "alt.FacetChart":
    "Small multiples of (layers, heads, queries, keys) weights: a grid with one small heat map per layer and head."
    import altair as alt

    layers, heads, n_q, n_k = weights.shape
    return alt.Chart(alt.Data(values=_records(weights))).mark_rect().encode(
        x=alt.X("key:O", axis=None), y=alt.Y("query:O", axis=None),
        color=alt.Color("weight:Q", scale=alt.Scale(domain=[0, 1], scheme="blues")),
    ).properties(width=cell * n_k, height=cell * n_q).facet(
        row=alt.Row("layer:O", title="layer"), column=alt.Column("head:O", title="head"), title=title)


STATISTICS = {
    "entropy": "entropy of a query's weights, in bits (0: one token; the uniform_entropy: everything equally)",
    "uniform_entropy": "the entropy of uniform weights over the same keys, for comparison",
    "distance": "average distance |query - key| in positions, weighted by attention (self-attention)",
    "previous": "weight on the token just before the query (self-attention)",
    "same": "weight on the query's own position (self-attention)",
    "next": "weight on the token just after the query (encoder self-attention; the decoder cannot look ahead)",
    "boundary": "weight on the sentence boundary: the source's </s> (encoder, cross), <s> (decoder)",
    "alignment": "for a target word that occurs once, as the same string, in the source (names, numbers, "
                 "punctuation): weight on that source word when the decoder predicts it (cross-attention)",
}


def head_statistics(captured: CapturedAttention) -> list[dict]:
    """What each head does, in numbers: one record per kind, layer and head with the `STATISTICS`, each an
    average over all (real) query positions of all captured pairs. `alignment_rows` counts the predictions the
    alignment statistic rests on."""
    sums, counts = {}, {}
    for i in range(len(captured.src_tokens)):
        src, tgt = captured.src_tokens[i], captured.tgt_tokens[i]
        # target positions predicting a word that appears exactly once in the source, and where it is
        once = {w: j for j, w in enumerate(src) if src.count(w) == 1 and w not in ("</s>", "<unk>")}
        gold = [(t, once[w]) for t, w in enumerate(tgt) if w in once]
        for kind, w in captured.pair(i).items():  # (layers, heads, queries, keys)
            n_q, n_k = w.shape[-2:]
            q, k = torch.arange(n_q)[:, None], torch.arange(n_k)[None, :]
            stats = {"entropy": -(w * torch.log2(w.clamp_min(1e-12))).sum(-1),
                     "uniform_entropy": torch.log2((q >= k).sum(-1).float() if kind == "decoder"
                                                   else torch.full((n_q,), float(n_k))).expand(w.shape[:-1])}
            if kind != "cross":
                stats["distance"] = (w * (q - k).abs()).sum(-1)
                offsets = {"previous": -1, "same": 0, **({} if kind == "decoder" else {"next": 1})}  # no look-ahead
                stats.update({name: (w * (k - q == offset)).sum(-1) for name, offset in offsets.items()})
            stats["boundary"] = w[..., 0] if kind == "decoder" else w[..., n_k - 1]
            for name, value in stats.items():  # value: (layers, heads, queries) -> sums over queries
                sums[kind, name] = sums.get((kind, name), 0) + value.sum(-1)
            counts[kind] = counts.get(kind, 0) + n_q
            if kind == "cross" and gold:
                rows, cols = zip(*gold)
                sums[kind, "alignment"] = sums.get((kind, "alignment"), 0) + w[:, :, list(rows), list(cols)].sum(-1)
                counts["alignment"] = counts.get("alignment", 0) + len(gold)
    records = []
    for kind in KINDS:
        layers, heads = captured.weights[kind].shape[1:3]
        for l in range(layers):
            for h in range(heads):
                record = {"kind": kind, "layer": l + 1, "head": h + 1}
                for name in STATISTICS:
                    if (kind, name) in sums:
                        n = counts["alignment" if name == "alignment" else kind]
                        record[name] = round(float(sums[kind, name][l, h]) / n, 4)
                if kind == "cross":
                    record["alignment_rows"] = counts.get("alignment", 0)
                records.append(record)
    return records


def head_statistics_chart(statistics: list[dict]) -> "alt.Chart":
    """Bars of one statistic for every head, sorted; a drop-down menu picks the statistic (see `STATISTICS`)."""
    import altair as alt

    names = [n for n in STATISTICS if n != "uniform_entropy"]
    rows = [{"head": f"{KINDS[r['kind']].split()[0].lower()} L{r['layer']} H{r['head']}", "kind": KINDS[r["kind"]],
             "statistic": name, "value": r[name]} for r in statistics for name in names if name in r]
    statistic = alt.param(name="statistic", value="entropy",
                          bind=alt.binding_select(options=names, name="statistic "))
    return alt.Chart(alt.Data(values=rows)).mark_bar().encode(
        x=alt.X("value:Q", title=None), y=alt.Y("head:N", sort="-x", title=None),
        color=alt.Color("kind:N", title=None, legend=alt.Legend(orient="bottom")),
        tooltip=["head:N", "statistic:N", alt.Tooltip("value:Q", format=".3f")],
    ).add_params(statistic).transform_filter(alt.datum.statistic == statistic).properties(width=420)


def uniform_attention(captured: CapturedAttention) -> CapturedAttention:
    """A baseline with the shapes and masks of `captured`: one layer of one head per kind that spreads each
    query's weight evenly over every key it may see. Its `head_statistics` are what chance looks like."""
    src_real = torch.tensor([[j < len(s) for j in range(captured.weights["encoder"].size(-1))]
                             for s in captured.src_tokens], dtype=torch.float)        # (batch, S)
    n_t = captured.weights["decoder"].size(-1)
    tgt_real = torch.tensor([[t < len(s) for t in range(n_t)] for s in captured.tgt_tokens], dtype=torch.float)
    allowed = {"encoder": src_real[:, None, :] * src_real[:, :, None],
               "decoder": tgt_real[:, None, :] * tgt_real[:, :, None] * torch.ones(n_t, n_t).tril(),
               "cross": src_real[:, None, :] * tgt_real[:, :, None]}                 # (batch, queries, keys)
    weights = {kind: (a / a.sum(-1, keepdim=True).clamp_min(1))[:, None, None] for kind, a in allowed.items()}
    return CapturedAttention(weights, captured.src_tokens, captured.tgt_tokens)


_CHART_FORMATS = {".html": "vegalite_to_html", ".png": "vegalite_to_png", ".svg": "vegalite_to_svg"}


def save_chart(chart, path) -> Path:
    """Save an Altair chart (or its Vega-Lite specification, a dict) to `path`: `.html`, a page that draws it offline
    (the Vega libraries inlined); `.png` or `.svg`, a picture. Needs vl-convert: the `viz` extra."""
    path = Path(path)
    if path.suffix.lower() not in _CHART_FORMATS:
        raise ValueError(f"{path}: a chart is saved as {', '.join(_CHART_FORMATS)}")
    try:
        import vl_convert
    except ModuleNotFoundError:
        raise ModuleNotFoundError("saving a chart needs vl-convert: pip install 'annotated-transformer[viz]'") from None
    spec = chart if isinstance(chart, dict) else chart.to_dict()
    options = {".html": {"bundle": True}, ".png": {"scale": 2}}.get(path.suffix.lower(), {})
    drawn = getattr(vl_convert, _CHART_FORMATS[path.suffix.lower()])(spec, **options)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as f:
        f.write(drawn if isinstance(drawn, bytes) else drawn.encode())
    return path
