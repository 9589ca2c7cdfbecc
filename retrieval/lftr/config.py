"""LFTR configuration: one flat dataclass, loadable from YAML and overridable from the command line.

The defaults are the paper's full configuration (App. "LFTR (full configuration)"): width 512, a 3-layer 8-head
Transformer context encoder, a 3-layer transition MLP, rollout depth H=8, K=32 samples, a horizon-conditioned
sigma head; multi-query max-similarity InfoNCE (tau 0.04) with 384 random + 128 hard negatives, grounding MSE
(weight 0.5); AdamW (lr 3e-4, weight decay 1e-4), cosine schedule, 50 epochs, batch 256, best-val-R@5 checkpoint.

Ablation switches (the paper's Tables 12, 13, 16, 17 and App. "limits"): ``rollout_depth: 1`` (H=1
horizon-conditioned read), ``n_hard_negatives: 0``, ``grounding_weight: 0``, ``condition_question: false`` (no
question type / question text), ``use_sigma: false`` (no sigma head: one sample, the mean),
``intermediate_weight: w`` (intermediate-horizon supervision, Table 16), ``grounding_target: prototype``
(ground to the target state's prototype instead of the GT centroid), ``read_rule`` in `READ_RULES`
(``calibrated``: the per-horizon step calibration learned on the validation split), and ``frames``: which prefix
frames the head reads (GenState-AI's last-frame-only ablation is ``frames: last``; the forecasters' ``--frames``
spelling, `eval.frames.FrameSelection`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from eval.errors import InputError
from eval.frames import FrameSelection
from eval.io import FormatError, atomic_path
from eval.io import read_yaml as _read_yaml_file
from eval.schema import PREFIX_FRAMES
from eval.tracking import parse_report_to
from retrieval.encoders import PRECISIONS

_TYPES = {"int": int, "float": (int, float), "str": str, "bool": bool}

#: How the prediction is read off the rollout ``mu_1..mu_H``:
#: ``matched`` reads step h (the query's horizon, clipped to H); ``fixed1`` reads step 1; ``best_step_oracle``
#: reads, per query, the step whose ranking of the GT is best (needs the GT: an oracle, analysis only);
#: ``multi_hypothesis`` scores an item by the max over the H projected step means ``P(mu_1)..P(mu_H)`` (no
#: sampling noise); ``calibrated`` reads, for a query of horizon h, the step chosen for h on the validation split
#: (the step whose matched-style read has the best validation R@val_k among the queries of that horizon).
READ_RULES = ("matched", "fixed1", "best_step_oracle", "multi_hypothesis", "calibrated")
#: Grounding targets: the GT centroid of the query (default) or the target state's prototype.
GROUNDING_TARGETS = ("centroid", "prototype")
#: Validation scorers: torch on the training device (default) or eval's streaming scorer (numba, CPU).
VAL_SCORERS = ("torch", "stream")


@dataclass
class LFTRConfig:
    # --- spaces ---
    target_space: str = ""  # retrieval space the head reads into (semantic: states; visual: segments)
    # space whose `prefixes` table holds the 8 prefix tokens ("" = first space that has one); "a+b": the spaces'
    # tokens concatenated per frame (the paper's Table 10 prefix fusion)
    prefix_space: str = ""
    question_space: str = ""  # semantic space whose text encoder embeds the question text ("" = none)
    frames: str = "all"  # prefix frames read: all | last | K (the K last) | spaced:K (K evenly spaced, last kept)
    # --- model ---
    d_model: int = 512
    n_layers: int = 3
    n_heads: int = 8
    ff_mult: int = 4
    dropout: float = 0.1
    transition_depth: int = 3
    rollout_depth: int = 8
    n_samples: int = 32
    use_sigma: bool = True
    condition_question: bool = True  # question type (+ question text when question_space is set)
    condition_horizon: bool = True
    # --- objective ---
    tau: float = 0.04
    n_random_negatives: int = 384
    n_hard_negatives: int = 128
    hard_negative_candidates: int = 0  # neighbours mined per positive before the query's GT is dropped (0: 2 x n_hard)
    grounding_weight: float = 0.5
    grounding_target: str = "centroid"  # centroid | prototype
    intermediate_weight: float = 0.0  # Table 16: grounding of the intermediate steps to the states passed through
    # --- optimisation ---
    epochs: int = 50
    batch_size: int = 256
    lr: float = 3e-4
    weight_decay: float = 1e-4
    grad_clip: float = 1.0
    seed: int = 0
    device: str = ""  # "" = cuda when available, else cpu
    threads: int = 0  # CPU threads of torch during the job (0 = the CPUs this process may use, eval.threads)
    #: fp32 | bf16 (autocast of the training step: matrix products in bfloat16) | auto (bf16 where the device
    #: computes it natively, `retrieval.encoders.native_bf16`); validation and prediction always run in float32
    precision: str = "fp32"
    # --- evaluation ---
    read_rule: str = "matched"
    val_every: int = 1
    val_k: int = 5  # checkpoint selection metric: R@val_k on the validation split
    val_scorer: str = "torch"  # torch (on the training device) | stream (eval's numba scorer on the CPU)
    val_max_queries: int = 0  # 0 = every validation query; else a fixed random subset of this size (seeded)
    train_split: str = "train"
    #: share of the training split's videos whose queries train the head (1 = all): the first of them in the order
    #: of `fraction_videos` (a hash of the video id, the same for every seed), so smaller shares are nested in larger
    #: ones -- a learning curve (`scripts/ceiling_curve.py`); validation is never subsampled
    train_fraction: float = 1.0
    val_split: str = "val"
    # --- tracking ---
    report_to: str = "none"  # none | tensorboard | wandb | tensorboard,wandb | all (`eval.tracking`)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        self.frames = _canonical_frames(self.frames)
        for f in fields(self):  # a YAML or --set value of the wrong type (epochs: many) is named, not cast
            v, want = getattr(self, f.name), _TYPES.get(str(f.type))
            if want is not None and (not isinstance(v, want) or (isinstance(v, bool) and want is not bool)):
                raise InputError(f"{f.name} must be {f.type}, got {type(v).__name__} {v!r}")
        if self.read_rule not in READ_RULES:
            raise InputError(f"read_rule must be one of {READ_RULES}, got {self.read_rule!r}")
        if self.grounding_target not in GROUNDING_TARGETS:
            raise InputError(f"grounding_target must be one of {GROUNDING_TARGETS}, got {self.grounding_target!r}")
        if self.precision not in PRECISIONS:
            raise InputError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.val_scorer not in VAL_SCORERS:
            raise InputError(f"val_scorer must be one of {VAL_SCORERS}, got {self.val_scorer!r}")
        if self.intermediate_weight < 0 or self.grounding_weight < 0:
            raise InputError("loss weights must be >= 0")
        for name in ("d_model", "n_layers", "n_heads", "transition_depth", "rollout_depth", "n_samples", "epochs",
                     "batch_size", "val_every", "val_k"):
            if int(getattr(self, name)) < 1:
                raise InputError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise InputError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.tau <= 0:
            raise InputError(f"tau must be > 0, got {self.tau}")
        if not 0 < self.train_fraction <= 1:
            raise InputError(f"train_fraction must be in (0, 1], got {self.train_fraction}")
        if self.n_random_negatives < 0 or self.n_hard_negatives < 0:
            raise InputError("negative counts must be >= 0")
        parse_report_to(self.report_to, check_installed=False)  # names only: installed is checked when training

    @property
    def frame_index(self) -> tuple[int, ...]:
        """0-based positions (in time order) of the prefix frames the head reads, out of `PREFIX_FRAMES`."""
        return FrameSelection.parse(self.frames).apply(range(PREFIX_FRAMES))

    @property
    def n_hard_candidates(self) -> int:
        """Neighbours mined per positive item (before the query's excluded items are dropped)."""
        return self.hard_negative_candidates or 2 * self.n_hard_negatives

    # --- I/O ---
    @classmethod
    def from_dict(cls, d: dict[str, Any], *, source: str = "<config>") -> LFTRConfig:
        names = {f.name: f for f in fields(cls)}
        unknown = sorted(set(d) - set(names))
        if unknown:
            raise InputError(f"{source}: unknown LFTR config key(s) {unknown}; known keys: {sorted(names)}")
        return cls(**d)

    @classmethod
    def from_yaml(cls, path: str | Path) -> LFTRConfig:
        """The defaults with the keys of one YAML file applied."""
        return cls().with_overrides(read_yaml(path))

    def with_overrides(self, overrides: list[str] | dict[str, Any]) -> LFTRConfig:
        """Apply ``key=value`` strings (values parsed as YAML scalars) or a dict; unknown keys raise."""
        d = asdict(self)
        items = overrides.items() if isinstance(overrides, dict) else (_split(o) for o in overrides)
        types = {f.name: f.type for f in fields(self)}
        for k, v in items:
            if k not in d:
                raise InputError(f"unknown LFTR config key {k!r} in override; known keys: {sorted(d)}")
            if isinstance(v, str) and types[k] != "str":
                v = yaml.safe_load(v)
            if isinstance(v, str) and types[k] == "float":  # YAML 1.1 reads 1e-3 (no dot) as a string
                with contextlib.suppress(ValueError):
                    v = float(v)
            d[k] = v
        return LFTRConfig.from_dict(d)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, path: str | Path) -> None:
        with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
            yaml.safe_dump(self.to_dict(), f, sort_keys=False)

    def training_hash(self) -> str:
        """Hash of everything that changes the trained weights (not evaluation-only keys): resume guard."""
        d = {k: v for k, v in self.to_dict().items() if k not in ("read_rule", "device", "val_every", "threads",
                                                                     "val_scorer", "report_to")}
        if d["frames"] == "all":  # the default reads every frame: checkpoints written before the key keep their hash
            del d["frames"]
        if d["train_fraction"] == 1:  # likewise: every training video
            del d["train_fraction"]
        if d["precision"] == "fp32":  # likewise: float32 training
            del d["precision"]
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def _canonical_frames(value: Any) -> Any:
    """``frames`` in its canonical spelling (``all``, ``last:K``, ``spaced:K``); a YAML integer K is ``last:K``."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        return value  # the type check names it
    try:
        return str(FrameSelection.parse(value))
    except ValueError:
        raise InputError(f"frames must be all, last, K (the K last prefix frames, K >= 1) or spaced:K, "
                         f"got {value!r}") from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The key/value mapping of a config file; unknown keys raise `ValueError` naming the file."""
    d = _read_yaml_file(path)
    if not isinstance(d, dict):
        raise InputError(f"{path}: expected a mapping of config keys, got {type(d).__name__}")
    known = {f.name for f in fields(LFTRConfig)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise InputError(f"{path}: unknown LFTR config key(s) {unknown}; known keys: {sorted(known)}")
    return d


def _split(s: str) -> tuple[str, str]:
    if "=" not in s:
        raise InputError(f"override {s!r} is not of the form key=value")
    k, v = s.split("=", 1)
    return k.strip(), v.strip()


def load_config(paths: list[str | Path] | None = None, overrides: list[str] | None = None, **fixed: Any) -> LFTRConfig:
    """Defaults <- each YAML file in order <- ``fixed`` (CLI options that are set) <- ``key=value`` overrides."""
    cfg = LFTRConfig()
    for p in paths or []:
        try:
            cfg = cfg.with_overrides(read_yaml(p))
        except FormatError:
            raise
        except ValueError as e:  # a value the config rejects: name the file it came from
            raise FormatError(p, str(e)) from None
    cfg = cfg.with_overrides({k: v for k, v in fixed.items() if v is not None})
    return cfg.with_overrides(overrides or [])
