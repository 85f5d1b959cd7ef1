"""Run directories (`annotated_transformer.lib.runs`): one process at a time, damaged run files named, a start
that fails leaves no folder, a resume restores the newest checkpoint."""

import json

import pytest
import torch
from _ext.book_charts import plot_metrics

from annotated_transformer import make_model
from annotated_transformer.lib.checkpoints import CheckpointError, TrainingState, load_checkpoint, save_checkpoint
from annotated_transformer.lib.devices import rng_state
from annotated_transformer.lib.recipes import RECIPES
from annotated_transformer.lib.runs import RunDir
from annotated_transformer.lib.trainer import train
from annotated_transformer.training import EOS, make_optimizer


def test_a_start_that_fails_before_writing_anything_leaves_no_folder(tmp_path, monkeypatch):
    "Not a folder holding only `.lock`: the folders the run made go again; one that was there stays."
    from annotated_transformer.lib import trainer
    from annotated_transformer.lib.runs import RunDir

    def no_data(recipe):
        raise RuntimeError("the data could not be read")

    monkeypatch.setattr(trainer, "load_task", no_data)
    with pytest.raises(RuntimeError, match="the data could not be read"):
        trainer.train(RECIPES["copy"], tmp_path / "runs" / "copy", device="cpu", progress=False)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "mine").mkdir()
    with pytest.raises(RuntimeError), RunDir(tmp_path / "mine"):
        raise RuntimeError("a start that failed")
    assert list(tmp_path.iterdir()) == [tmp_path / "mine"] and list((tmp_path / "mine").iterdir()) == []
    with RunDir(tmp_path / "new") as run:  # a run that wrote something keeps its folder
        (run.path / "config.json").write_text("{}")
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == [".lock", "config.json"]


TINY = RECIPES["copy"].replace(N=1, d_model=32, d_ff=64, steps=24, warmup=10, eval_every=8, checkpoint_every=8)


def test_run_dir_refuses_a_folder_that_holds_a_run(tmp_path):
    cpu = torch.device("cpu")
    with_metrics, with_checkpoint = RunDir(tmp_path / "a"), RunDir(tmp_path / "b")
    with_metrics.path.mkdir()
    with_metrics.metrics.write_text('{"step": 8}\n')
    save_checkpoint(with_checkpoint.path / "checkpoints" / "step-000008.pt", {"config": {}, "model": {}, "step": 8})
    for run in (with_metrics, with_checkpoint):
        with pytest.raises(FileExistsError, match="already holds a run"):
            run.start(TINY, cpu, 1, 1, resume=False)
        assert not (run.path / "config.json").exists()
        run.start(TINY, cpu, 1, 1, resume=True)  # continuing the run in it is allowed
        assert json.loads((run.path / "config.json").read_text())["recipe"] == TINY.to_dict()
    RunDir(tmp_path / "c", writer=False).start(TINY, cpu, 2, 1, resume=False)  # only the writer writes
    assert not (tmp_path / "c").exists()


def test_resume_restores_the_newest_checkpoint_and_forgets_metrics_logged_after_it(tmp_path):
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    model = make_model(13, 13, TINY.model)
    optimizer, scheduler = make_optimizer(model, TINY.model.d_model, TINY.factor, TINY.warmup)
    run = RunDir(tmp_path / "run")
    run.start(TINY, cpu, 1, 1, resume=False)
    for step in (8, 16, 24):
        run.log({"step": step, "train_loss": 1.0})
    state = {
        "config": TINY.to_dict()["model"],
        "recipe": TINY.to_dict(),
        "src_vocab": 13,
        "tgt_vocab": 13,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "epoch": 1,
        "position": 3,
        "elapsed_s": 2.5,
        "window": (4.0, 20),
        "rng": rng_state(cpu),
    }
    run.save({**state, "step": 8}, keep=5)
    expected_draw = torch.rand(3)  # what dropout would draw next, at the newest checkpoint
    run.save({**state, "step": 16}, keep=5)
    (run.path / "checkpoints" / "step-best.pt").write_bytes(b"not the run's own")

    torch.manual_seed(1)
    fresh = make_model(13, 13, TINY.model)
    fresh_optimizer, fresh_scheduler = make_optimizer(fresh, TINY.model.d_model, TINY.factor, TINY.warmup)
    reader = RunDir(run.path, writer=False)
    reader.resume(TINY, fresh, fresh_optimizer, fresh_scheduler, cpu)
    assert len(run.metrics.read_text().splitlines()) == 3  # only the writer rewrites the metrics
    restored = RunDir(run.path).resume(TINY, fresh, fresh_optimizer, fresh_scheduler, cpu)
    assert restored == TrainingState(
        step=16,
        epoch=1,
        position=3,
        elapsed_s=2.5,
        window_loss=4.0,
        window_tokens=20,
        last={"step": 16, "train_loss": 1.0},
    )  # the newest evaluation kept
    assert [json.loads(line)["step"] for line in run.metrics.read_text().splitlines()] == [8, 16]
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))
    assert torch.equal(torch.rand(3), expected_draw)
    with pytest.raises(
        ValueError,
        match=r"step-000016.pt: a resumed run keeps its settings, and these differ: "
        r"dropout=0.2 \(the run has 0.0\), seed=5 \(the run has 0\)",
    ):
        run.resume(TINY.replace(seed=5, dropout=0.2), fresh, fresh_optimizer, fresh_scheduler, cpu)
    with pytest.raises(ValueError, match="at update 16 already, past steps=10"):
        run.resume(TINY.replace(steps=10), fresh, fresh_optimizer, fresh_scheduler, cpu)
    with pytest.raises(CheckpointError, match=r"written by 1 process\(es\); resume with as many \(now 2\)"):
        run.resume(TINY, fresh, fresh_optimizer, fresh_scheduler, cpu, rank=0, world_size=2)


def test_run_directory_contents_and_guards(tmp_path):
    run = tmp_path / "run"
    summary = train(TINY.replace(keep_checkpoints=2), run, device="cpu", progress=False)
    assert sorted(p.name for p in run.iterdir()) == [
        ".lock",
        "checkpoints",
        "config.json",
        "metrics.jsonl",
        "summary.json",
    ]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000016.pt", "step-000024.pt"]
    assert load_checkpoint(run / "checkpoints" / "step-000024.pt")["vocab"]["eos"] == EOS
    assert json.loads((run / "config.json").read_text())["recipe"] == TINY.replace(keep_checkpoints=2).to_dict()
    assert json.loads((run / "summary.json").read_text()) == {"format": "summary 1", **summary}
    line = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert set(line) == {
        "format",
        "step",
        "epoch",
        "train_loss",
        "valid_loss",
        "valid_ppl",
        "lr",
        "tokens_per_s",
        "elapsed_s",
    }
    assert {"recipe", "device", "steps", "wall_time_s", "final", "exact_match"} <= set(summary)
    with pytest.raises(FileExistsError, match="already holds a run"):
        train(TINY, run, device="cpu", progress=False)
    with pytest.raises(
        ValueError,
        match=r"config.json: a resumed run keeps its settings, .* keep_checkpoints=5 "
        r"\(the run has 2\)",
    ):
        train(TINY, run, device="cpu", progress=False, resume=True)
    with pytest.raises(ValueError, match="factor must be a positive number"):
        TINY.replace(factor=float("nan"))
    with pytest.raises(ValueError, match="clip_norm must be a positive number"):
        TINY.replace(clip_norm=True)
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        train(TINY, tmp_path / "empty", device="cpu", progress=False, resume=True)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="'cuda' is not available here"):
            train(TINY, tmp_path / "gpu", device="cuda", progress=False)
    import matplotlib

    matplotlib.use("Agg")
    assert len(plot_metrics(run).get_lines()) == 2
