"""Build what `arch_driver.py` and `test_fc_architectures.py` need, in one process of the toolkit's venv.

usage: python arch_prep.py OUT_DIR     -> OUT_DIR/spec.json (and the models, adapter and benchmark it names)

Each tiny model is built by the ``forecasters tiny-model --kind KIND --template native`` command (its typer app,
called in process); the student's LoRA adapter (r 8, random, strong enough to change the outputs) on the tiny
Qwen3-VL; a small synthetic benchmark for the runner. Timings go into the spec.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]


def random_lora(model_dir: Path, out: Path) -> Path:
    """A random LoRA adapter (r 8) on the language model's q/v projections, its B matrices drawn with std 0.5."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(model_dir)
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, init_lora_weights=False,
                                                  target_modules=r".*language_model.*\.(q_proj|v_proj)"))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    peft_model.save_pretrained(out)
    return out


def main() -> None:
    from arch_cases import CASES

    from eval.synth import build_benchmark
    from forecasters.cli import app

    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    timings, models = {}, {}
    for case in CASES:
        t0 = time.monotonic()
        models[case.kind] = str(out / "models" / case.kind)
        app(["tiny-model", "--kind", case.kind, "--template", "native", "--out", models[case.kind]],
            standalone_mode=False)
        timings[f"build/{case.kind}"] = round(time.monotonic() - t0, 1)
    t0 = time.monotonic()
    adapter = random_lora(Path(models["qwen3_vl"]), out / "student-adapter")
    timings["build/lora"] = round(time.monotonic() - t0, 1)
    t0 = time.monotonic()
    synth = build_benchmark(out / "synth", videos=40, seed=0, progress=False)  # 40: the test split has queries
    timings["build/synth"] = round(time.monotonic() - t0, 1)
    (out / "runs").mkdir(exist_ok=True)
    spec = {"results": str(out / "results.json"), "synth_dir": str(synth), "runs_dir": str(out / "runs"),
            "models": models, "adapter": str(adapter), "cases": [c.kind for c in CASES], "timings_s": timings}
    (out / "spec.json").write_text(json.dumps(spec, indent=1))


if __name__ == "__main__":
    main()
