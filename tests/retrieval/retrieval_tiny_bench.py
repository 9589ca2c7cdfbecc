"""A tiny hand-built benchmark for retrieval unit tests that need exact control (a few videos, known states).

Each video has one object following a state trajectory decided by its domain and a latent "route"; the prefix
frames show the first state with a route-dependent tint, so the future is predictable from the prefix. The
``pixels`` space holds per-segment features = state direction + video noise (appearance varies across videos).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from eval.features import l2_normalize, write_meta, write_table
from eval.io import write_json, write_jsonl

STATES = ["resting on the ramp", "rolling down the ramp", "falling", "bouncing", "resting on the floor",
          "sliding across the table", "tipping over", "lying on its side"]
#: A tiny image tower for tests (seconds on CPU): 24x32 frames, 12 patches of 8x8, one attention block.
TINY_TOWER = ["tower.image_height=24", "tower.image_width=32", "tower.hidden_size=32", "tower.layers=1",
              "tower.heads=2", "tower.out_dim=32", "optim.batch_size=32", "optim.threads=1"]
#: A perceiver small enough for a test (`retrieval.perceiver`).
TINY_PERCEIVER = ["net.channels=[8,16]", "net.image_height=24", "net.image_width=32", "optim.batch_size=32",
                  "optim.threads=1"]
ROUTES = {"ramp": [[0, 1, 2, 3, 4], [0, 1, 4, 4, 4]], "table": [[5, 6, 7, 2, 4], [5, 2, 3, 4, 4]]}


def build_tiny(out: Path, videos: int = 24, seed: int = 0, dim: int = 16) -> Path:
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    (out / "frames").mkdir(exist_ok=True)
    state_dir = l2_normalize(rng.normal(size=(len(STATES), dim)))
    route_dir = l2_normalize(rng.normal(size=(2, dim)))
    states = [{"id": f"s{i}", "text": t, "members": [t], "n_segments": 0} for i, t in enumerate(STATES)]
    corpus, feats, plan, prefixes = [], [], [], {}
    for v in range(videos):
        domain = "ramp" if v % 2 == 0 else "table"
        route = int(rng.integers(2))
        traj = ROUTES[domain][route]
        split = "train" if v < videos * 0.6 else ("val" if v < videos * 0.8 else "test")
        vid = f"v{v:03d}"
        segs = []
        for j, s in enumerate(traj[:4] if traj[3] != traj[4] else traj[:3] + [traj[4]]):
            cid = f"c{v:03d}{j}"
            frame = f"frames/{vid}_{j}.png"
            color = (int(30 * s) % 255, int(60 + 20 * route), int(100 + 10 * j))
            Image.new("RGB", (12, 10), color).save(out / frame)
            corpus.append({"id": cid, "video_id": vid, "domain": domain, "object_id": f"{vid}/o0", "subject": "red ball",
                           "state": STATES[s], "state_id": f"s{s}", "state_type1": f"red ball {STATES[s]}",
                           "start": float(j), "end": float(j) + 1.0, "frame": frame, "raw": STATES[s]})
            feats.append(state_dir[s] + 0.6 * rng.normal(size=dim))
            states[s]["n_segments"] += 1
            segs.append((cid, s, float(j)))
        pid = f"p{v:03d}"
        prefixes[pid] = l2_normalize(state_dir[segs[0][1]][None] + 0.8 * route_dir[route][None]
                                     + 0.3 * rng.normal(size=(8, dim)))
        plan.append((vid, domain, split, pid, segs))
    by_state: dict[int, list[tuple[str, str, str]]] = {}
    for c in corpus:
        by_state.setdefault(int(c["state_id"][1:]), []).append((c["id"], c["video_id"], c["domain"]))
    queries = []
    for vid, domain, split, pid, segs in plan:
        frames = [f"frames/{vid}_0.png"] * 8
        for h in range(1, len(segs)):
            cid, s, t = segs[h]
            members = by_state[s]
            pools = {"in_video": [m[0] for m in members if m[1] == vid],
                     "in_dataset": [m[0] for m in members if m[1] != vid and m[2] == domain],
                     "cross_dataset": [m[0] for m in members if m[2] != domain], "bge_similar": [], "consensus": []}
            pools["consensus"] = pools["in_dataset"][:2]
            queries.append({
                "id": f"q{vid}{h}", "prefix_id": pid, "video_id": vid, "domain": domain, "object_id": f"{vid}/o0",
                "subject": "red ball", "qtype": "Q1" if h == 1 else "Q2", "horizon": h,
                "question": f"What will the red ball be doing {h} states from now?", "target_state": STATES[s],
                "target_state_id": f"s{s}", "target_state_type1": f"red ball {STATES[s]}", "target_time": t,
                "prefix_start": 0.0, "prefix_end": 0.5, "prefix_frames": frames,
                "transcript": [{"t": 0.0, "state": STATES[segs[0][1]]}], "split": split, "gt_pools": pools,
                "gt_type1": pools["in_dataset"] + pools["cross_dataset"],
                "fair": bool(pools["in_dataset"] or pools["cross_dataset"]),
                "group_id": None, "k_seconds": None, "anchor_state": None})
    write_jsonl(out / "queries.jsonl", queries)
    write_jsonl(out / "corpus.jsonl", corpus)
    write_jsonl(out / "states.jsonl", states)
    write_table(out, "pixels", "corpus", [c["id"] for c in corpus], l2_normalize(np.asarray(feats)))
    pids = list(prefixes)
    write_table(out, "pixels", "prefixes", pids, np.stack([prefixes[p] for p in pids]))
    write_meta(out, "pixels", kind="visual", dim=dim, model="tiny-pixels")
    write_json(out / "manifest.json", {
        "name": "tiny", "version": "1.0", "format_version": "1.0",
        "counts": {"queries": len(queries), "corpus": len(corpus), "states": len(states), "videos": videos,
                   "prefixes": len(pids)},
        "domains": ["ramp", "table"], "spaces": {"pixels": {"kind": "visual", "dim": dim, "model": "tiny-pixels"}}})
    return out


if __name__ == "__main__":
    import sys

    print(json.dumps(str(build_tiny(Path(sys.argv[1])))))
