"""Experiment tracking for the toolkit's training loops: ``--report-to``, with the values of transformers'
``TrainingArguments.report_to``.

Values: ``none`` (the default), ``tensorboard``, ``wandb``, both comma-separated (``tensorboard,wandb``), or ``all``
(whichever of the two is installed; nothing when neither is). A chosen tracker that is not installed raises
`eval.errors.MissingDependency` naming the pip command, before the job does any work.

Loops written by the toolkit (LFTR) log through `EpochReporter`: one record per epoch, every number of the record
under its own key as the tag (``loss``, ``val_R@5``, ``train_seconds``, ...) at step = the epoch (1-based):

- ``tensorboard``: event files in ``<folder>/runs/`` (`torch.utils.tensorboard.SummaryWriter`); a resumed training
  reopens them with ``purge_step`` = its last finished epoch and logs that epoch again, so each epoch is there once;
- ``wandb``: ``wandb.init(project=$WANDB_PROJECT or "psr-toolkit", name=<folder name>, dir=<folder>, config=...)``,
  one ``run.log(record, step=epoch)`` per epoch; the run id is kept in ``<folder>/wandb-run-id`` so a resumed
  training continues the same W&B run (``resume="allow"``).

Trainers built on transformers' ``Trainer`` (the canon fine-tune) pass `parse_report_to`'s list to their
training arguments instead, and transformers' own callbacks log.
"""

from __future__ import annotations

import importlib.util
import os
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from eval.errors import InputError, MissingDependency

#: Trackers the toolkit wires itself -> the pip distribution that provides them (also their import name).
TRACKERS: dict[str, str] = {"tensorboard": "tensorboard", "wandb": "wandb"}
NONE, ALL = "none", "all"
REPORT_TO_HELP = ("experiment tracking: none | tensorboard | wandb | tensorboard,wandb | all (whichever of them is "
                  "installed); transformers' report_to values")
#: Folder (inside the output folder) of the TensorBoard event files.
TENSORBOARD_DIR = "runs"
WANDB_ID_FILE = "wandb-run-id"
DEFAULT_WANDB_PROJECT = "psr-toolkit"


def is_installed(tracker: str) -> bool:
    """Whether the tracker's package can be imported (found on the path; not imported)."""
    return importlib.util.find_spec(TRACKERS[tracker]) is not None


def parse_report_to(value: str | Sequence[str] | None, *, check_installed: bool = True) -> tuple[str, ...]:
    """The trackers named by a ``--report-to`` value (module docstring), in `TRACKERS` order, each once.

    Raises `InputError` for an unknown name and, with ``check_installed``, `MissingDependency` for a chosen
    tracker that is not installed."""
    items = [] if value is None else [value] if isinstance(value, str) else list(value)
    names = [n.strip().lower() for item in items for n in str(item).split(",") if n.strip()]
    if names in ([], [NONE]):
        return ()
    if ALL in names:
        if names != [ALL]:
            raise InputError(f"--report-to {_spell(value)}: 'all' stands alone", fix="pass --report-to all")
        return tuple(t for t in TRACKERS if is_installed(t)) if check_installed else tuple(TRACKERS)
    unknown = [n for n in names if n not in TRACKERS]
    if unknown:
        raise InputError(f"--report-to {_spell(value)}: unknown tracker(s) {unknown}",
                         fix=f"choose {NONE}, {ALL}, or a comma-separated list of {', '.join(TRACKERS)}")
    chosen = tuple(t for t in TRACKERS if t in names)
    missing = [t for t in chosen if check_installed and not is_installed(t)]
    if missing:
        raise MissingDependency(f"--report-to {_spell(value)}: {' and '.join(missing)} "
                                f"{'is' if len(missing) == 1 else 'are'} not installed",
                                fix="pip install " + " ".join(TRACKERS[t] for t in missing))
    return chosen


def _spell(value) -> str:
    return value if isinstance(value, str) else ",".join(map(str, value))


def numeric_fields(record: Mapping[str, Any]) -> dict[str, float]:
    """The record's numbers (bools and the ``epoch`` counter left out) as floats: what a tracker logs."""
    return {k: float(v) for k, v in record.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and k != "epoch"}


class EpochReporter:
    """Logs per-epoch records to the chosen trackers (module docstring). Use as a context manager.

    ``resume_step``: the last epoch a resumed training finished (TensorBoard hides anything logged at or after it
    by an earlier, interrupted call; log that epoch again). ``config``: the run's resolved config (W&B config)."""

    def __init__(self, trackers: Sequence[str], folder: str | os.PathLike, *, run_name: str,
                 config: Mapping[str, Any] | None = None, resume_step: int | None = None):
        self.folder = Path(folder)
        self._tb = self._wandb = None
        if "tensorboard" in trackers:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.folder / TENSORBOARD_DIR), purge_step=resume_step)
        if "wandb" in trackers:
            import wandb

            self._wandb = wandb.init(project=os.environ.get("WANDB_PROJECT") or DEFAULT_WANDB_PROJECT, name=run_name,
                                     dir=str(self.folder), config=dict(config or {}), id=self._wandb_run_id(),
                                     resume="allow")

    def _wandb_run_id(self) -> str:
        """The W&B run id of this folder: read from `WANDB_ID_FILE`, or made and written there."""
        from eval.io import atomic_path

        path = self.folder / WANDB_ID_FILE
        if path.is_file() and path.read_text(encoding="utf-8").strip():
            return path.read_text(encoding="utf-8").strip()
        run_id = uuid.uuid4().hex[:16]
        with atomic_path(path) as tmp:
            tmp.write_text(run_id + "\n", encoding="utf-8")
        return run_id

    def log(self, record: Mapping[str, Any], step: int) -> None:
        """Log the record's numbers (`numeric_fields`) at ``step``; flushed at once (a crash loses nothing logged)."""
        values = numeric_fields(record)
        if self._tb is not None:
            for k, v in values.items():
                self._tb.add_scalar(k, v, global_step=step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(values, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> EpochReporter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
