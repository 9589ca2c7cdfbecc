"""A training run's outputs and resumption (`distill.train`): the output directory of one config, checkpoints that
carry their config hash, and the loss over every step of a run resumed any number of times.

- ``<output_dir>/train.config.json`` holds the config hash (`distill.train_args.TrainIdentity`); a directory holding
  another hash's run is refused (`check_output_dir`), so a run never overwrites another config's record.
- ``<output_dir>/checkpoints/checkpoint-N/psr_train.json`` holds the hash of the run that saved it
  (`checkpoint_callback`); `resolve_resume` resumes only a checkpoint of this run's hash.
- The Trainer's ``train_loss`` covers the steps of its last run only; `loss_over_all_steps` weights the logged windows
  of the restored history, which the callback makes cover every step up to each checkpoint.
"""

from __future__ import annotations

from pathlib import Path

TRAIN_CONFIG = "train.config.json"
CHECKPOINT_INFO = "psr_train.json"


def check_output_dir(out: Path, identity) -> None:
    """Refuse an output directory holding another config's run (``train.config.json`` of another hash), or
    checkpoints / an adapter without any ``train.config.json``."""
    from eval.errors import OutputRefused
    from eval.io import read_json

    f = out / TRAIN_CONFIG
    if f.exists():
        old = read_json(f)
        if old.get("config_hash") != identity.config_hash:
            diff = identity.diff(old.get("identity") or {})
            raise OutputRefused(f"{out} holds a run of another config (hash {old.get('config_hash')}, this run "
                                f"{identity.config_hash}; differing: {', '.join(diff[:8]) or '?'})",
                                fix="use another --output_dir, or delete that directory to start over")
    elif (out / "checkpoints").exists() or (out / "adapter").exists():
        raise OutputRefused(f"{out} holds checkpoints/ or adapter/ but no {TRAIN_CONFIG}: not a distill.train run "
                            "whose config can be checked", fix="use another --output_dir")


def resolve_resume(value: str | None, out: Path, identity) -> str | None:
    """The checkpoint to resume from: ``auto`` -> the newest complete one under ``checkpoints/`` (None if there is
    none; a checkpoint is complete once its ``psr_train.json`` is written, after the Trainer saved it, so one cut
    while saving by an interruption is passed over), a path -> that checkpoint; either must carry this run's config
    hash (``psr_train.json``), else it is refused."""
    from eval.errors import InputError
    from eval.io import read_json

    if value in (None, "", "none", "null", "false", "False"):
        return None
    if value == "auto":
        ckpt = last_complete_checkpoint(out / "checkpoints")
        if ckpt is None:
            return None
    else:
        ckpt = value
        if not Path(ckpt).is_dir():
            raise InputError(f"resume_from_checkpoint {ckpt} does not exist")
    info = Path(ckpt) / CHECKPOINT_INFO
    if not info.is_file():
        raise InputError(f"checkpoint {ckpt} has no {CHECKPOINT_INFO} (not written by distill.train, or cut while "
                         "saving): its config cannot be checked",
                         fix="delete it to resume from the one before, or start over in a new output_dir")
    saved = read_json(info)
    if saved.get("config_hash") != identity.config_hash:
        diff = identity.diff(saved.get("identity") or {})
        raise InputError(f"checkpoint {ckpt} was trained with config {saved.get('config_hash')}, this run is "
                         f"{identity.config_hash} (differing: {', '.join(diff[:8]) or '?'}); refusing to resume it",
                         fix="rerun with the checkpoint's config, or use another --output_dir")
    return ckpt


def last_complete_checkpoint(folder: Path) -> str | None:
    """The ``checkpoint-N`` of ``folder`` with the largest N that holds ``psr_train.json`` (None when none does)."""
    import re

    if not folder.is_dir():
        return None
    steps = [(int(m.group(1)), p) for p in folder.iterdir() if p.is_dir()
             and (m := re.fullmatch(r"checkpoint-(\d+)", p.name)) and (p / CHECKPOINT_INFO).is_file()]
    return str(max(steps)[1]) if steps else None


def checkpoint_callback(identity):
    """A Trainer callback that logs the loss at every checkpoint step (so the log history covers every step before a
    resumption), saves an epoch's last checkpoint after that epoch's evaluation, and writes the config hash into each
    checkpoint (``psr_train.json``)."""
    from transformers import TrainerCallback

    from eval.io import write_json

    class PSRCheckpoints(TrainerCallback):
        deferred = False

        def on_step_end(self, args, state, control, **kwargs):
            if control.should_save:
                control.should_log = True
                if args.eval_strategy == "epoch" and state.epoch is not None and float(state.epoch).is_integer():
                    # the epoch's evaluation runs after this step's save: save after it, so the checkpoint's
                    # history holds that evaluation (a resumed run keeps every epoch's eval)
                    control.should_save, self.deferred = False, True
            return control

        def on_epoch_end(self, args, state, control, **kwargs):
            if control.should_save or self.deferred:
                control.should_save = control.should_log = True
                self.deferred = False
            return control

        def on_save(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
                write_json(ckpt / CHECKPOINT_INFO, {"config_hash": identity.config_hash,
                                                    "identity": identity.to_dict()})
            return control

    return PSRCheckpoints()


def clock_callback():
    """A Trainer callback that stamps every log-history entry with the CPU seconds (``cpu_s``: every thread of this
    process, `time.process_time`) and wall seconds (``wall_s``) since training began in this process, so
    ``train_log.json`` gives the cost of each logged window of steps (`scripts/bench_train_load.py` reads it)."""
    import time

    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        t0 = c0 = None

        def on_train_begin(self, args, state, control, **kwargs):
            self.t0, self.c0 = time.perf_counter(), time.process_time()
            return control

        def on_log(self, args, state, control, logs=None, **kwargs):
            if self.t0 is not None and state.log_history:
                state.log_history[-1].update(cpu_s=round(time.process_time() - self.c0, 3),
                                             wall_s=round(time.perf_counter() - self.t0, 3))
            return control

    return Clock()


def loss_over_all_steps(history: list[dict], resumed_at: int, run_loss: float, global_step: int) -> float | None:
    """Mean training loss over all ``global_step`` optimizer steps, those before a resumption included.

    ``sum_w loss_w * len_w / global_step`` over the logged windows ``w`` (a logged ``loss`` is the mean over the
    steps since the previous log); a tail after the last log is ``run_loss * (global_step - resumed_at)`` (the
    Trainer's mean over this run's steps) minus this run's logged windows. ``train_loss`` of the Trainer itself
    covers only the steps of the last run."""
    total = this_run = 0.0
    prev = 0
    for step, loss in sorted((h["step"], h["loss"]) for h in history if "loss" in h):
        w = loss * (step - prev)
        total += w
        this_run += w if step > resumed_at else 0.0
        prev = step
    if prev < global_step:
        total += run_loss * (global_step - resumed_at) - this_run
    return total / global_step if global_step else None


def eval_history(history: list[dict]) -> list[dict]:
    """Eval entries of the log history, one per evaluation (eval loss and answer accuracy merged by step)."""
    by_step: dict[int, dict] = {}
    for h in history:
        if any(k.startswith("eval_") for k in h):
            by_step.setdefault(h["step"], {"step": h["step"], "epoch": h.get("epoch")}).update(
                {k: v for k, v in h.items() if k.startswith("eval_")})
    return [by_step[s] for s in sorted(by_step)]
