"""The trainer: the training chapter's steps (`accumulate_gradients`, `optimizer_step`) run for a recipe, with what a
run of hours needs around them: a run directory that resumes exactly, checkpoints, processes under `torchrun`, bf16
autocast where the device computes it natively, and progress on the terminal."""

import math
import time

import torch

from ..model import make_model
from ..training import (PAD, LabelSmoothing, accumulate_gradients, batches_of, make_optimizer, optimizer_step,
                        pair_lengths, token_batches, validation_loss)
from .checkpoints import TrainingState, training_checkpoint
from .devices import check_device, rng_state
from .processes import Processes, accumulation_steps, rank_and_world_size, split_for_processes
from .progress import ProgressReport
from .recipes import Recipe
from .runs import RunDir
from .tasks import load_task
from .vocab import shares_vocabulary


def data_lengths(pairs) -> tuple[list[int], list[int]]:
    """`pair_lengths` of the training chapter; data kept on disk (the WMT data, `wmt.TokenData`) reports them itself,
    through a `lengths()` method, without reading every sentence."""
    return pairs.lengths() if hasattr(pairs, "lengths") else pair_lengths(pairs)


def train(recipe: Recipe, run_dir, *, device=None, resume: bool = False, progress: bool = True,
          stop_after: int | None = None, compile: bool = False, tensorboard: bool = False,
          bf16: bool | None = None) -> dict:
    """Train `recipe` into `run_dir` (see `RunDir`) on `device` (default: the best available); returns the summary,
    also in summary.json. `bf16` runs the forward pass in bf16 autocast (default: as a resumed run did, else
    `bf16_by_default(device)`). `resume=True` continues exactly from the newest checkpoint (a finished run stays as
    it is unless `recipe.steps` asks for more); `stop_after` ends the run after that many updates, as an interruption
    would; `compile=True` compiles the model; `tensorboard=True` also writes the metrics as TensorBoard event files.
    `progress` shows a bar on a terminal, and a line per evaluation elsewhere. Under `torchrun` the processes train
    one model together, each with its share of every update's batches; process 0 alone evaluates and writes. The
    updates are those of the training chapter's `train_model`: the same batches, the same steps, the same weights."""
    device, rank = check_device(device), rank_and_world_size()[0]
    with (RunDir(run_dir, writer=rank == 0, tensorboard=tensorboard) as run,  # one training at a time in run_dir
          ProgressReport(recipe, show=progress and rank == 0) as report):
        if resume and (summary := run.finished(recipe)):
            return report.finished(summary)
        autocast = run.bf16_autocast(device, bf16, resume)
        with report.loading():  # a first use of the data may download it, or tokenize it
            task = load_task(recipe)
        torch.manual_seed(recipe.seed)
        model = make_model(task.src_vocab, task.tgt_vocab, recipe.model, shared_vocab=shares_vocabulary(task.vocab)).to(device)
        if compile:
            model.compile()  # in place: the module, its parameters and their names stay the same
        src_lengths, tgt_lengths = data_lengths(task.train)
        data = (len(src_lengths), sum(src_lengths), sum(tgt_lengths), task.src_vocab)  # the same in every process
        processes = Processes(model, device, recipe.seed, data)
        optimizer, scheduler = make_optimizer(model, recipe.model.d_model, recipe.factor, recipe.warmup)
        criterion = LabelSmoothing(task.tgt_vocab, PAD, recipe.model.label_smoothing)
        world, accum = processes.world, accumulation_steps(recipe, processes.world)
        state = run.resume(recipe, model, optimizer, scheduler, device, rank, world) if resume else TrainingState()
        run.start(recipe, device, world, accum, resume, bf16_autocast=autocast)
        end = recipe.steps if stop_after is None else min(recipe.steps, stop_after)
        started, saved_at = time.perf_counter() - state.elapsed_s, time.perf_counter()
        window_start = saved_at
        order, last = None, state.last  # the newest evaluation, also of a resumed run
        while state.step < end:
            if order is None or state.position == 0:  # each epoch its own shuffle, from the seed and the epoch
                batches = token_batches(src_lengths, tgt_lengths, recipe.max_tokens, recipe.seed + state.epoch)
                order = split_for_processes(batches, world)
            update = order[state.position:state.position + world * accum]  # the same in every process, shared out
            mine, normalizer = processes.share(update, tgt_lengths)
            group = [batches_of(task.train, b).to(device) for b in mine]
            loss, ntokens = accumulate_gradients(processes.learner, group, criterion, autocast, normalizer)
            due = time.perf_counter() - saved_at >= 60 * (recipe.checkpoint_minutes or math.inf)
            loss, ntokens, due = processes.total(loss, ntokens, due)
            if not math.isfinite(loss):
                raise FloatingPointError(f"the loss became {loss} at update {state.step + 1}; lower the learning rate "
                                         "(factor) or set clip_norm, and resume from the last checkpoint")
            lr = optimizer_step(model, optimizer, scheduler, recipe.clip_norm)
            state.advance(len(update), len(order), loss, ntokens)
            report.update(state.step, loss / ntokens, lr, state.window_tokens / (time.perf_counter() - window_start))
            if rank == 0 and (state.step % recipe.eval_every == 0 or state.step == recipe.steps):
                now, valid = time.perf_counter(), validation_loss(model, task.valid, recipe.max_tokens, device)
                last = {"step": state.step, "epoch": state.epoch, "train_loss": state.window_loss / state.window_tokens,
                        "valid_loss": valid, "valid_ppl": math.exp(valid) if valid < 700 else None, "lr": lr,
                        "tokens_per_s": state.window_tokens / (now - window_start), "elapsed_s": now - started}
                run.log(last)
                report.evaluation(last)
                state.window_loss, state.window_tokens, window_start = 0.0, 0, time.perf_counter()
            if state.step % recipe.checkpoint_every == 0 or state.step == end or due:
                state.elapsed_s = time.perf_counter() - started
                rng, recorded = processes.random_states(rng_state(device), state.step)
                run.save(training_checkpoint(recipe, task, model, optimizer, scheduler, state, rng, **recorded),
                         recipe.keep_checkpoints)
                saved_at = time.perf_counter()
        summary = {"recipe": recipe.name, "device": str(device), "steps": state.step,
                   "finished": state.step >= recipe.steps, "wall_time_s": time.perf_counter() - started,
                   **({"final": last} if last else {})}
        if rank == 0 and summary["finished"]:  # a run stopped during this evaluation resumes to run it alone
            summary.update(task.evaluate(model.eval(), device))
        return run.finish(summary)
