"""How much of the queried object's present state a prefix space perceives: a linear probe (simulator-truth builds).

LFTR from frames forecasts from what its prefix space perceives. On a synthetic build the present is known exactly:
the segment of the queried object active at the prefix's end (`eval.segments.SegmentTimeline`) carries ``sim_state``,
the simulator's state as five attributes (`ATTRIBUTES`: motion | place | relation | the other object's kind | pose).
`perception` fits, for each prefix space and attribute, a multinomial logistic regression (`C`: regularised, so it
reads what is linearly there rather than learning features) from the prefix's last token and its change from the token
before (``[x_last; x_last - x_prev]``, standardised on the fitting split) to the attribute. It fits on the prefixes of
one split's videos and scores on another's: accuracy per attribute, and the share of prefixes whose five attributes
are all right (the present state, exactly).

Reference rows beside the spaces:

- ``majority``: each attribute's most common value on the fitting split (a probe that reads nothing); for all five,
  the most common whole state;
- ``box`` (where the benchmark records the object's box in each prefix frame, ``Query.prefix_boxes``): the box's
  centre and size at the last frame and the centre's displacement from the frame before, in pixels. It is what a
  tracker gives without looking at the object: a visual space that reads less of the present than this is not
  perceiving the state.
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass

import numpy as np

from eval.errors import InputError
from eval.segments import SegmentTimeline

ATTRIBUTES = ("motion", "place", "relation", "other", "pose")
"""The parts of a ``sim_state`` (``motion|place|relation|other|pose``; an empty part is a value too: none)."""
C = 0.1
"""Inverse regularisation strength of the probes (scikit-learn's ``C``)."""
MAX_ITER = 100
TOL = 1e-3
"""The probes' iteration cap and tolerance: a probe, so a fit stopped at the cap is kept (on the demo's build the
accuracies move by at most 1 point against 500 iterations at 1e-4, at a third of the cost)."""
MAJORITY, BOX = "majority", "box"


@dataclass
class Present:
    """The present state of each prefix's queried object: ``labels[i]`` the five attributes of ``prefix_ids[i]``
    (`ATTRIBUTES`), ``split[i]`` its video's split, ``boxes[i]`` its last two prefix boxes (``None`` without boxes)."""

    prefix_ids: list[str]
    split: np.ndarray
    labels: np.ndarray
    boxes: np.ndarray | None


def _sim_states(bench) -> list | None:
    """The corpus's ``sim_state`` column (the simulator's state of each segment), or None when it has none."""
    cd = bench.corpus_ds
    sim = cd["sim_state"][:] if "sim_state" in cd.column_names else []
    return sim if any(sim) else None


def has_truth(bench) -> bool:
    """The corpus carries the simulator's state of its segments (``sim_state``), which the probe needs."""
    return _sim_states(bench) is not None


def present_states(bench) -> Present:
    """`Present` of every prefix of ``bench`` whose object has a segment active at the prefix's end (from the first
    query of each prefix). Raises `InputError` on a benchmark without simulator truth (no ``sim_state``)."""
    qd = bench.queries_ds
    sim = _sim_states(bench)
    if sim is None:
        raise InputError(f"{bench.root}: the corpus has no `sim_state`; the perception probe needs the simulator's "
                         "truth of a synthetic build (`python -m retrieval synth`)")
    timeline = SegmentTimeline.of(bench)
    has_boxes = "prefix_boxes" in qd.column_names
    cols = ["prefix_id", "video_id", "object_id", "prefix_end", "split"] + (["prefix_boxes"] if has_boxes else [])
    table = {c: qd[c][:] for c in cols}
    ids, split, labels, boxes, seen = [], [], [], [], set()
    for i, pid in enumerate(table["prefix_id"]):
        if pid in seen:
            continue
        seen.add(pid)
        row = timeline.active(table["video_id"][i], table["object_id"][i], table["prefix_end"][i])
        if row < 0 or not sim[row]:
            continue
        parts = str(sim[row]).split("|")
        if len(parts) != len(ATTRIBUTES):
            raise InputError(f"{bench.root}: corpus row {row}: sim_state {sim[row]!r} has {len(parts)} parts, "
                             f"expected {len(ATTRIBUTES)} ({'|'.join(ATTRIBUTES)})")
        ids.append(pid)
        split.append(table["split"][i])
        labels.append(parts)
        if has_boxes:
            b = table["prefix_boxes"][i]
            boxes.append(b[-2:] if b is not None and len(b) >= 2 and all(x is not None for x in b[-2:]) else None)
    box_arr = None
    if has_boxes and boxes and all(b is not None for b in boxes):
        box_arr = np.asarray(boxes, np.float64)
    return Present(ids, np.asarray(split), np.asarray(labels, dtype=object).reshape(-1, len(ATTRIBUTES)), box_arr)


def box_features(boxes: np.ndarray) -> np.ndarray:
    """``(n, 6)``: centre x, y and width, height of the last box, and the centre's displacement from the box before
    (``boxes``: ``(n, 2, 4)`` ``[x0, y0, x1, y1]``)."""
    centre = (boxes[:, :, :2] + boxes[:, :, 2:]) / 2
    size = boxes[:, -1, 2:] - boxes[:, -1, :2]
    return np.concatenate([centre[:, -1], size, centre[:, -1] - centre[:, 0]], axis=1)


def token_features(tokens: np.ndarray) -> np.ndarray:
    """``(n, 2d)``: the last token and its change from the one before (``tokens``: ``(n, frames, d)``)."""
    last = tokens[:, -1]
    prev = tokens[:, -2] if tokens.shape[1] > 1 else last
    return np.concatenate([last, last - prev], axis=1)


def probe(x_fit: np.ndarray, y_fit: np.ndarray, x_test: np.ndarray) -> np.ndarray:
    """Predicted labels of ``x_test`` by a logistic regression fitted on ``(x_fit, y_fit)`` (features standardised
    on ``x_fit``); one class on the fitting side predicts it everywhere."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    classes = np.unique(y_fit)
    if len(classes) < 2:
        return np.full(len(x_test), classes[0] if len(classes) else "", dtype=object)
    mean, std = x_fit.mean(axis=0), x_fit.std(axis=0)
    std = np.where(std > 1e-8, std, 1.0)
    model = LogisticRegression(C=C, max_iter=MAX_ITER, tol=TOL)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit((x_fit - mean) / std, y_fit)
    return model.predict((x_test - mean) / std)


def _scores(pred: np.ndarray, truth: np.ndarray) -> dict:
    right = pred == truth
    return {"accuracy": {a: float(right[:, k].mean()) for k, a in enumerate(ATTRIBUTES)},
            "all": float(right.all(axis=1).mean())}


def perception(bench, spaces: list[str], *, fit_split: str = "train", split: str = "test") -> dict:
    """The probe of each prefix space of ``spaces`` (a name, or ``a+b`` for the spaces' tokens concatenated), after
    the reference rows (module docstring); ``{"rows": [{"name", "kind", "dim", "accuracy": {attribute: share},
    "all"}...], "n_fit", "n_test", "fit_split", "split", "attributes"}``."""
    from threadpoolctl import threadpool_limits

    from retrieval.lftr.data import load_prefix_space

    if fit_split == split:
        raise InputError(f"the probe fits on --fit-split {fit_split!r} and scores on --split {split!r}: choose two "
                         "different splits")
    present = present_states(bench)
    fit, test = present.split == fit_split, present.split == split
    for name, mask in ((fit_split, fit), (split, test)):
        if not mask.any():
            raise InputError(f"{bench.root}: no prefix of split {name!r} has a present state to probe")
    y_fit, y_test = present.labels[fit], present.labels[test]
    rows = []
    # the most common value (a tie goes to the value seen first, so the row never depends on set order)
    top = Counter("|".join(r) for r in y_fit).most_common(1)[0][0]
    maj = [Counter(y_fit[:, k]).most_common(1)[0][0] for k in range(len(ATTRIBUTES))]
    rows.append({"name": MAJORITY, "kind": "reference", "dim": 0,
                 "accuracy": {a: float((y_test[:, k] == maj[k]).mean()) for k, a in enumerate(ATTRIBUTES)},
                 "all": float(np.mean(["|".join(r) == top for r in y_test]))})

    def probed(name: str, kind: str, x: np.ndarray) -> dict:
        if not np.isfinite(x).all():  # a space's tables are checked when loaded; this catches the boxes
            bad = np.flatnonzero(~np.isfinite(x).all(axis=1))[0]
            raise InputError(f"{bench.root}: the {name} features of prefix {present.prefix_ids[bad]!r} hold NaN or "
                             "inf values")
        pred = np.stack([probe(x[fit], y_fit[:, k], x[test]) for k in range(len(ATTRIBUTES))], axis=1)
        return {"name": name, "kind": kind, "dim": int(x.shape[1]), **_scores(pred, y_test)}

    # one BLAS thread: at these sizes (thousands of prefixes) more threads only wait; on the demo's build two took
    # 3x the CPU seconds of one, for the same fits
    with threadpool_limits(1):
        if present.boxes is not None:
            rows.append(probed(BOX, "reference", box_features(present.boxes)))
        for name in spaces:
            space = load_prefix_space(bench, name)
            tokens = np.asarray(space.prefixes.array, np.float32)[space.prefix_rows(present.prefix_ids)]
            rows.append(probed(name, "space", token_features(tokens.astype(np.float64))))
    return {"fit_split": fit_split, "split": split, "n_fit": int(fit.sum()), "n_test": int(test.sum()),
            "attributes": list(ATTRIBUTES), "C": C, "rows": rows}


def to_markdown(res: dict) -> str:
    """The probe's table: accuracy per attribute and for all five, in %, one row per input."""
    attrs = res["attributes"]
    lines = [f"The present state of the queried object (the simulator's, at the prefix's end) read by a linear probe "
             f"from each prefix space's last token and its change from the one before: fitted on the "
             f"{res['n_fit']:,} prefixes of split {res['fit_split']}, scored on the {res['n_test']:,} of split "
             f"{res['split']}; accuracy in %. `{MAJORITY}`: the most common value of the fitting split; `{BOX}`: the "
             "object's box alone (last centre and size, last displacement), what a tracker gives.", "",
             "| input | dim | " + " | ".join(attrs) + " | all five |", "|---|---:|" + "---:|" * (len(attrs) + 1)]
    for r in res["rows"]:
        name = f"`{r['name']}`" + (" (reference)" if r["kind"] == "reference" else "")
        cells = " | ".join(f"{100 * r['accuracy'][a]:.1f}" for a in attrs)
        lines.append(f"| {name} | {r['dim'] or ''} | {cells} | {100 * r['all']:.1f} |")
    return "\n".join(lines) + "\n"
