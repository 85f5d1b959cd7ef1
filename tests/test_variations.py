"""Table 3 in miniature (book/10_variations.ipynb): the rows, how each is scored, and a command that resumes."""

import dataclasses
import json
import math

import pytest
import torch
from conftest import needs_mirror

from annotated_transformer.decoding import beam_search
from annotated_transformer.lib.recipes import RECIPES
from annotated_transformer.lib.trainer import train
from annotated_transformer.lib.variations import (
    DEFAULT_BASE,
    PAPER_TABLE3,
    Variation,
    run_variations,
    table3_rows,
    variations_table,
)
from annotated_transformer.model import TransformerConfig, make_model
from annotated_transformer.multi_head import explicit_attention
from annotated_transformer.training import Batch

BASE = RECIPES[DEFAULT_BASE]


def parameters(config: TransformerConfig, vocab: int = 100) -> int:
    with torch.device("meta"):  # shapes only
        return sum(p.numel() for p in make_model(vocab, vocab, config).parameters())


def test_the_rows_of_the_books_base():
    assert [r.name for r in table3_rows(BASE)] == [
        "base",
        "base-seed1",
        "base-seed2",
        "A-h1",
        "A-h8",
        "A-h16",
        "B-dk16",
        "B-dk8",
        "C-N1",
        "C-N4",
        "C-d64",
        "C-d256",
        "C-ff128",
        "C-ff512",
        "D-dropout0.0",
        "D-dropout0.2",
        "D-ls0.0",
        "D-ls0.2",
        "E-learned",
    ]


def test_row_d_takes_the_papers_values_other_than_the_bases():
    # a base without dropout and with label smoothing 0.2: row (D) also tries the paper's 0.1 for both
    recipe = BASE.replace(dropout=0.0, label_smoothing=0.2)
    assert [r.name for r in table3_rows(recipe) if r.row == "D"] == [
        "D-dropout0.1",
        "D-dropout0.2",
        "D-ls0.0",
        "D-ls0.1",
    ]
    assert [r.name for r in table3_rows(BASE.replace(dropout=0.3)) if r.row == "D"][:3] == [
        "D-dropout0.0",
        "D-dropout0.1",
        "D-dropout0.2",
    ]


@pytest.mark.parametrize(
    "base",
    [BASE.model, TransformerConfig(), TransformerConfig(d_model=64, h=4, d_k=8)],
    ids=["books-base", "papers-base", "base-with-d_k"],
)
@pytest.mark.parametrize("seed", [0, 7])
def test_each_row_changes_one_thing_and_row_a_keeps_the_computation(base, seed):
    recipe = BASE.replace(**dataclasses.asdict(base), seed=seed)
    d_k = base.d_k or base.d_model // base.h
    rows = table3_rows(recipe)
    assert [row.recipe(recipe).seed for row in rows if row.row == "base"] == [seed, seed + 1, seed + 2]
    for row in rows:
        varied = row.recipe(recipe)
        changed = {k for k, v in dataclasses.asdict(varied.model).items() if v != getattr(base, k)}
        if row.row == "base":
            assert changed == set() and row.name == ("base" if varied.seed == seed else f"base-seed{varied.seed}")
            continue
        assert varied.seed == seed and (
            len(changed - {"d_k"}) == 1 or changed == {"d_k"} == {k for k, _ in row.changes}
        ), row
        if row.row == "A":  # other heads, d_k = d_v = d_model / h: the same projections, split otherwise
            assert varied.model.h != base.h and varied.model.d_k is None
            assert parameters(varied.model) == parameters(dataclasses.replace(base, d_k=None))
        elif row.row == "B":
            assert changed == {"d_k"} and varied.model.d_k < d_k and parameters(varied.model) < parameters(base)
        elif row.row == "C" and "d_model" in changed:
            assert varied.model.d_k is None  # the heads kept: d_k follows the width


def test_seeds_and_the_papers_table():
    assert [r.name for r in table3_rows(BASE, seeds=1)][:2] == ["base", "A-h1"]
    with pytest.raises(ValueError, match="seeds must be at least 1"):
        table3_rows(BASE, seeds=0)
    assert len(PAPER_TABLE3) == 20 and PAPER_TABLE3[0] == {
        "row": "base",
        "changes": {},
        "dev_ppl": 4.92,
        "dev_bleu": 25.8,
        "params_m": 65,
    }
    assert {r["row"] for r in PAPER_TABLE3} == {"base", "A", "B", "C", "D", "E", "big"}
    assert all(r["changes"]["h"] * r["changes"]["d_k"] == 512 for r in PAPER_TABLE3 if r["row"] == "A")


def test_a_model_with_narrower_keys_decodes_the_same_on_every_path():
    torch.manual_seed(0)
    model = make_model(20, 20, N=2, d_model=32, d_ff=64, h=4, d_k=4).eval()
    src = torch.randint(4, 20, (3, 7))
    batch = Batch(src, src)
    with explicit_attention():
        explicit = model(batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask)
    torch.testing.assert_close(
        model(batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask), explicit, rtol=1e-5, atol=1e-5
    )
    greedy = [[h.tokens for h in beam_search(model, src, batch.src_mask, beam_size=1, cache=c)] for c in (True, False)]
    assert greedy[0] == greedy[1]
    cached, uncached = (beam_search(model, src, batch.src_mask, beam_size=3, cache=c) for c in (True, False))
    assert [h.tokens for h in cached] == [h.tokens for h in uncached]


@pytest.mark.parametrize("d_k", [0, 1.5, "8"])
def test_a_configuration_refuses_a_d_k_that_is_no_positive_integer(d_k):
    with pytest.raises(ValueError, match="d_k must be a positive integer or None"):
        TransformerConfig(d_k=d_k)


@needs_mirror
def test_the_rows_resume_without_training_a_scored_row_again(tmp_path, cache):
    base = BASE.replace(
        N=1,
        d_model=32,
        d_ff=64,
        max_len=64,
        steps=6,
        warmup=3,
        eval_every=3,
        checkpoint_every=3,
        keep_checkpoints=2,
        average_checkpoints=2,
    )
    rows = [Variation("base", "base"), Variation("D", "D-ls0.0", (("label_smoothing", 0.0),))]
    out, results = tmp_path / "runs", tmp_path / "results" / "variations.json"
    # a row interrupted after 3 updates, trained as run_variations trains (float32)
    train(rows[1].recipe(base), out / "D-ls0.0", stop_after=3, progress=False, bf16=False)

    first = run_variations(base, out, rows, only=["base"], results=results, progress=False)
    assert [r["name"] for r in first["rows"]] == ["base"] and first["complete"] is False
    assert json.loads(results.read_text()) == {"format": "variations 1", **first}
    kept = {p.name: p.stat().st_mtime_ns for p in (out / "base").rglob("*") if p.is_file()}

    table = run_variations(base, out, rows, results=results, progress=False)
    assert [r["name"] for r in table["rows"]] == ["base", "D-ls0.0"] and table["complete"] is True
    assert {p.name: p.stat().st_mtime_ns for p in (out / "base").rglob("*") if p.is_file()} == kept  # read back
    logged = [json.loads(line)["step"] for line in (out / "D-ls0.0" / "metrics.jsonl").read_text().splitlines()]
    assert logged == [3, 6]  # resumed after update 3, not started again
    assert json.loads(results.read_text()) == {"format": "variations 1", **table}
    for row in table["rows"]:
        assert row["steps"] == 6 and row["params"] > 0 and math.isfinite(row["dev_ppl"]) and row["dev_ppl"] > 1
        assert 0 <= row["dev_bleu"] <= 100 and row["bleu_signature"].startswith("nrefs:1|case:mixed")
        assert row["settings"] == rows[[r.name for r in rows].index(row["name"])].recipe(base).to_dict()
    assert table["rows"][0]["averaged"]["checkpoints"] == ["step-000003.pt", "step-000006.pt"]
    assert "averaged" not in table["rows"][1] and table["rows"][1]["checkpoints"] == ["step-000006.pt"]
    assert variations_table(table).splitlines()[2].startswith("D     label_smoothing=0.0")

    # a row scored by a version without the `subwords` setting (its default, None) is read back, not scored again
    scored = out / "base" / "variation.json"
    older = json.loads(scored.read_text())
    del older["settings"]["subwords"]
    scored.write_text(json.dumps(older))
    run_variations(base, out, rows, results=results, progress=False)
    assert json.loads(scored.read_text()) == older

    with pytest.raises(ValueError, match="keeps its settings.*dropout"):  # another base is not this table
        run_variations(base.replace(dropout=0.3), out, rows, progress=False)
    with pytest.raises(ValueError, match="holds a run of 6 updates, not the 5 of this table.*--out"):
        run_variations(base.replace(steps=5), out, rows, progress=False)
    with pytest.raises(TypeError, match="only must be a list of row names"):
        run_variations(base, out, rows, only="base", progress=False)
