"""`bench` and `variations` from the command line (`annotated_transformer.cli.studies`): what each measures or trains,
the files it writes and names, and the mistakes it refuses."""

import json

import pytest

from annotated_transformer import TransformerConfig
from annotated_transformer.cli import main
from annotated_transformer.lib.bench import run_benchmark
from annotated_transformer.lib.devices import bf16_supported, device_slug
from annotated_transformer.lib.measure import bench_table, matmul_peak
from annotated_transformer.lib.recipes import RECIPES
from annotated_transformer.lib.variations import DEFAULT_BASE

TINY = TransformerConfig(N=1, d_model=32, d_ff=64, h=2)


@pytest.fixture
def small_peak(monkeypatch):
    "The benchmark measures its peak on products of 256 x 256 matrices, for tests that need no true peak."
    import annotated_transformer.lib.bench as bench

    monkeypatch.setattr(bench, "matmul_peak", lambda device, dtype: matmul_peak(device, dtype, size=256))


@pytest.mark.slow
def test_the_bench_command_measures_every_case_and_writes_results_and_a_table(
    tiny_subword_run, tmp_path, monkeypatch, capsys, small_peak
):
    import annotated_transformer.lib.bench as bench  # the command imports run_benchmark from here when it runs

    result = {}

    def quick(**kwargs):  # the command's own arguments, with a tiny model and few sentences
        result.update(run_benchmark(**kwargs, updates=1, sentences={1: 2, 64: 6}, models={"tiny": (TINY, 300)}))
        return result

    monkeypatch.setattr(bench, "run_benchmark", quick)
    out_dir = tmp_path / "results"
    command = ["bench", "--checkpoint", str(tiny_subword_run[0]), "--repeats", "1", "--device", "cpu"]
    assert main([*command, "--out", str(out_dir)]) == 0
    out, err = capsys.readouterr()
    bf16 = [("bf16", "length")] if bf16_supported("cpu") else []  # where the CPU computes in bf16
    cases = [
        ("straightforward", "random"),
        ("fast", "length"),
        *bf16,
        ("straightforward", "length"),
        ("fast", "random"),
    ]
    assert err.splitlines()[: len(cases)] == [f"training tiny: {path}, {batching} batches" for path, batching in cases]
    assert [(r["path"], r["batching"]) for r in result["training"]] == cases  # each change alone after the two paths
    assert result["training"][0]["speedup"] == 1.0 and "compile" in result
    peaks = result["matmul_peak"]  # measured here; MFU against the bf16 rate where there is one
    assert peaks["float32"] > 0 and result["mfu_peak"] == (peaks["bfloat16"] or peaks["float32"])
    assert all(r["mfu"] == pytest.approx(r["achieved_flops"] / result["mfu_peak"]) for r in result["training"])
    assert [r["bf16_autocast"] for r in result["training"]] == [path == "bf16" for path, _ in cases]
    assert len(result["translation"]) == 8 and all(r["same_as_other_path"] == 1.0 for r in result["translation"])
    vocab = RECIPES["multi30k-cpu"].subwords  # one shared vocabulary
    assert (result["translation_model"]["src_vocab"], result["translation_model"]["tgt_vocab"]) == (vocab, vocab)
    for r in result["translation"]:
        other = next(
            o
            for o in result["translation"]
            if (o["batch_size"], o["beam_size"], o["cache"]) == (r["batch_size"], r["beam_size"], False)
        )
        assert r["speedup"] == pytest.approx(r["tokens_per_s"]["median"] / other["tokens_per_s"]["median"])
        shared = r["seconds"]["total"] - r["seconds"]["decoder"]  # what a free decoder would leave
        assert r["speedup_bound"] == (pytest.approx(other["seconds"]["total"] / shared) if r["cache"] else None)
    json_path = out_dir / f"bench-{device_slug(result['device_name'])}.json"
    assert sorted(p.name for p in out_dir.iterdir()) == [json_path.name, json_path.with_suffix(".md").name]  # no temp
    assert json.loads(json_path.read_text())["translation"] == result["translation"]
    table = json_path.with_suffix(".md").read_text()
    assert result["device_name"] in table and table.count("\n| ") == len(cases) + 8 + 2 + 8 + 1  # rows, headers
    assert bench_table(result) in out and "| 64 | beam 4 | yes |" in out


def test_bench_command_needs_a_translator_or_no_translation(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["bench"]) == 2
    err = capsys.readouterr().err
    assert "train multi30k-cpu" in err and "--no-translation" in err and err.count("\n") == 1


def test_bench_command_without_translation(tmp_path, monkeypatch, capsys, small_peak):
    import annotated_transformer.lib.bench as bench  # the command imports run_benchmark from here when it runs

    seen = {}

    def quick(**kwargs):
        seen.update(kwargs)
        return run_benchmark(**kwargs, updates=1, models={"tiny": (TINY, 300)})

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bench, "run_benchmark", quick)
    assert main(["bench", "--no-translation", "--repeats", "1", "--device", "cpu"]) == 0
    assert seen["checkpoint"] is None and seen["compile"] is None
    assert "Translation: not measured" in capsys.readouterr().out
    assert len(list((tmp_path / "results").glob("bench-*.json"))) == 1


BASE = RECIPES[DEFAULT_BASE]


def test_the_command_names_the_rows_it_knows(capsys, tmp_path):
    assert main(["variations", "--only", "base", "A-h3", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--only: no row named A-h3; the rows are base, base-seed1" in err and "E-learned" in err
    assert main(["variations", "lr=0.1", "--out", str(tmp_path)]) == 2
    assert "unknown setting(s) lr" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_the_command_trains_into_one_folder_per_row_and_names_the_results_by_device(monkeypatch, tmp_path, capsys):
    import annotated_transformer.lib.variations as variations

    calls = []

    def stand_in(base, out_dir, rows, **options):
        calls.append((base, out_dir, [r.name for r in rows], options))
        return {"rows": [], "complete": False}

    monkeypatch.setattr(variations, "run_variations", stand_in)
    assert main(["variations", "--results", str(tmp_path), "--threads", "1"]) == 0
    ((base, out_dir, names, options),) = calls
    assert (
        base == BASE
        and str(out_dir) == f"runs/variations-{DEFAULT_BASE}"
        and names[:4] == ["base", "base-seed1", "base-seed2", "A-h1"]
    )
    assert options["results"].parent == tmp_path and options["results"].name.startswith("variations-")
    assert f"variations-{DEFAULT_BASE}-" not in options["results"].name
    # other settings (also after --only) or seeds: another folder and another results file, named by a digest
    assert main(["variations", "--only", "base", "A-h1", "steps=10", "--results", str(tmp_path)]) == 0
    _, out_dir, _, options = calls[-1]
    assert calls[-1][0].steps == 10 and options["only"] == ["base", "A-h1"]
    assert (
        str(out_dir).startswith(f"runs/variations-{DEFAULT_BASE}-")
        and str(out_dir) != f"runs/variations-{DEFAULT_BASE}"
    )
    names = {options["results"].name}
    assert main(["variations", "--seeds", "2", "--results", str(tmp_path)]) == 0
    assert calls[-1][1] == calls[0][1] and calls[-1][3]["results"].name not in names | {calls[0][3]["results"].name}
    assert main(["variations", "--base", "multi30k-cpu", "--results", str(tmp_path)]) == 0
    assert str(calls[-1][1]) == "runs/variations-multi30k-cpu"
    assert calls[-1][3]["results"].name.startswith("variations-multi30k-cpu-")
    assert "not every row is done yet" in capsys.readouterr().out
