"""Fixtures of the distillation tests: predicates and template rationales of the session's synthetic benchmark,
tiny random models (built once), a small SFT set and one trained QLoRA student shared by the serving tests."""

from __future__ import annotations

from pathlib import Path

import pytest

TINY_PRESET = Path(__file__).resolve().parents[2] / "configs" / "distill" / "tiny-cpu.yaml"


@pytest.fixture(scope="session")
def oracle(synth_bench):
    from distill.predicates import OracleIndex

    return OracleIndex(synth_bench)


@pytest.fixture(scope="session")
def pred_sets(synth_bench):
    """{query id: PredicateSet} for every query of the synthetic benchmark."""
    from distill.predicates import build_predicates

    return {ps.query_id: ps for ps in build_predicates(synth_bench, synth_bench.queries())}


@pytest.fixture(scope="session")
def validator(synth_bench):
    from distill.validator import validator_for

    return validator_for(synth_bench)


@pytest.fixture(scope="session")
def pred_file(synth_dir, tmp_path_factory):
    from distill.predicates import PredicatesConfig, write_predicates

    out = tmp_path_factory.mktemp("pred") / "predicates.jsonl"
    write_predicates(PredicatesConfig(data=str(synth_dir), out=str(out), progress=False))
    return out


@pytest.fixture(scope="session")
def template_rationales(synth_dir, pred_file, tmp_path_factory):
    """Template narration of the train split (directory with rationales.jsonl)."""
    from distill.narrate import NarrateConfig, run_narration

    out = tmp_path_factory.mktemp("rationales")
    run_narration(NarrateConfig(data=str(synth_dir), predicates=str(pred_file), out=str(out), narrator="template",
                                split=None, progress=False))
    return out


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory):
    """A tiny random Qwen3-VL (the DynaPix student family)."""
    from forecasters.tiny_models import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("tiny") / "qwen3_vl", "qwen3_vl", seed=0)


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory):
    """A tiny random Qwen2 text model (a stand-in teacher)."""
    from forecasters.tiny_models import build_tiny_qwen2

    return build_tiny_qwen2(tmp_path_factory.mktemp("tiny") / "qwen2", seed=0)


@pytest.fixture(scope="session")
def sft_dir(synth_dir, template_rationales, tmp_path_factory):
    """CoT and answer-only SFT sets (Parquet): 4 train queries and 2 val queries, 2 frames each (short sequences
    keep CPU steps fast)."""
    from distill.sft import SFTBuildConfig, build_sft

    out = tmp_path_factory.mktemp("sft")
    build_sft(SFTBuildConfig(data=str(synth_dir), rationales=str(template_rationales), out=str(out), frames=2,
                             limit=4, eval_rationales=str(template_rationales), eval_limit=2, progress=False))
    return out


@pytest.fixture(scope="session")
def tiny_train_args(tiny_vlm):
    """``(dataset, output_dir, *flags) -> (PSRTrainArgs, SFTConfig, ModelConfig)`` parsed as the command line does,
    from the tiny CPU preset with the tiny Qwen3-VL."""
    from distill.train_args import parse_train_args

    def make(dataset, out, *flags):
        return parse_train_args(["--config", str(TINY_PRESET), "--model_name_or_path", str(tiny_vlm),
                                 "--dataset_name", str(dataset), "--output_dir", str(out), *map(str, flags)])

    return make


@pytest.fixture(scope="session")
def student_flags():
    """Flags of `qlora_student`: 4 examples, effective batch 2 -> 2 steps per epoch, 2 epochs, eval per epoch."""
    return ("--max_steps", -1, "--num_train_epochs", 2, "--effective_batch_size", 2, "--save_steps", 2,
            "--save_total_limit", 2, "--eval_strategy", "epoch", "--seed", 0)


@pytest.fixture(scope="session")
def qlora_student(tiny_train_args, student_flags, sft_dir, tmp_path_factory):
    """A QLoRA student (4-bit NF4 base on CPU) trained on the CoT set for 2 epochs of 2 steps, checkpointed at steps
    2 and 4, evaluated (loss + answer accuracy) after each epoch. Returns (output_dir, metrics)."""
    import torch

    from distill.train import train

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("student") / "cot"
    return out, train(*tiny_train_args(sft_dir / "cot", out, *student_flags))
