"""The loss over every step of a resumed run (`distill.checkpoints.loss_over_all_steps`)."""

from __future__ import annotations

import pytest

from distill.checkpoints import eval_history, loss_over_all_steps


def test_loss_over_all_steps_weights_windows_and_the_unlogged_tail():
    per_step = [5.0, 4.0, 3.0, 2.0, 1.5, 1.0, 0.5]  # 7 optimizer steps
    history = [{"step": 1, "loss": 5.0},  # logging_first_step
               {"step": 4, "loss": (4.0 + 3.0 + 2.0) / 3},  # the window logged at the step-4 checkpoint
               {"step": 4, "eval_loss": 9.0},
               {"step": 6, "loss": (1.5 + 1.0) / 2}]  # the resumed run's window; step 7 was never logged
    run_loss = sum(per_step[4:]) / 3  # the Trainer's mean over the resumed run's steps 5-7
    assert loss_over_all_steps(history, 4, run_loss, 7) == pytest.approx(sum(per_step) / 7)
    assert loss_over_all_steps(history[:2], 0, sum(per_step[:4]) / 4, 4) == pytest.approx(sum(per_step[:4]) / 4)
    assert loss_over_all_steps([], 0, 0.0, 0) is None


def test_eval_history_merges_entries_of_one_evaluation():
    h = [{"step": 2, "epoch": 1.0, "eval_loss": 3.0}, {"step": 2, "epoch": 1.0, "eval_answer_accuracy": 0.5},
         {"step": 3, "loss": 1.0}, {"step": 4, "epoch": 2.0, "eval_loss": 2.0}]
    assert eval_history(h) == [{"step": 2, "epoch": 1.0, "eval_loss": 3.0, "eval_answer_accuracy": 0.5},
                               {"step": 4, "epoch": 2.0, "eval_loss": 2.0}]
