"""Benchmarks on the Hub (`eval.hub`): ``--data owner/name[@revision]`` resolves offline from a Hugging Face cache laid
out as huggingface_hub lays it out (``datasets--owner--name/{refs,snapshots,blobs}``), an id that is not cached is
one clear error on every ``--data`` command, and ``eval push`` validates before it calls the Hub (HfApi's methods
are replaced by recorders: the Hub is unreachable here)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_run import assert_one_clear_error, run_cli
from test_error_surface import DATA_COMMANDS, DISTILL_DATA_COMMANDS

from eval.hub import HubDataset, parse_hub_id, resolve_data
from eval.push import upload_list

REPO = Path(__file__).resolve().parents[2]
COMMIT_A, COMMIT_B = "a" * 40, "b" * 40


def cache_dataset(hub: Path, repo_id: str, files: dict[str, bytes], commit: str, refs: tuple[str, ...] = ("main",)):
    """Lay out ``files`` as huggingface_hub caches a downloaded dataset snapshot: content-addressed blobs (git blob
    sha1), ``snapshots/<commit>/<path>`` as relative symlinks to them, ``refs/<ref>`` holding the commit hash."""
    repo = hub / ("datasets--" + repo_id.replace("/", "--"))
    for rel, data in files.items():
        blob = repo / "blobs" / hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = repo / "snapshots" / commit / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for ref in refs:
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return repo / "snapshots" / commit


def folder_files(folder: Path, names=None) -> dict[str, bytes]:
    names = names if names is not None else upload_list(folder)
    return {rel: (folder / rel).read_bytes() for rel in names}


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hub cache, offline (what HF_HOME=... HF_HUB_OFFLINE=1 gives a fresh process)."""
    from huggingface_hub import constants

    hub = tmp_path / "hf" / "hub"
    hub.mkdir(parents=True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return hub


def test_hub_ids_and_paths():
    assert parse_hub_id("psr-org/psr-synth") == HubDataset("psr-org/psr-synth")
    assert parse_hub_id("psr-org/psr-synth@v1.0") == HubDataset("psr-org/psr-synth", "v1.0")
    assert HubDataset("a/b", "v1").download_command() == "hf download a/b --repo-type dataset --revision v1"
    for not_an_id in ("/abs/path", "./a/b", "a/b/c", "name", "a/b@", "a--/b", "../x/y"):
        assert parse_hub_id(not_an_id) is None, not_an_id


def test_data_id_resolves_offline_to_the_cached_snapshot(cli_world, hub_cache, tmp_path, monkeypatch):
    from eval.benchmark import Benchmark
    from eval.runs import read_run

    src = cli_world["bench"]
    snap_a = cache_dataset(hub_cache, "psr-test/tiny", folder_files(src), COMMIT_A, refs=("main",))
    changed = folder_files(src)
    changed["manifest.json"] = json.dumps({**json.loads(changed["manifest.json"]), "version": "9.9"}).encode()
    snap_b = cache_dataset(hub_cache, "psr-test/tiny", changed, COMMIT_B, refs=("v2",))
    assert resolve_data("psr-test/tiny") == snap_a
    assert resolve_data("psr-test/tiny@v2") == resolve_data(f"psr-test/tiny@{COMMIT_B}") == snap_b
    assert Benchmark.load("psr-test/tiny@v2").manifest.version == "9.9"
    assert Benchmark.load("psr-test/tiny").fingerprint == Benchmark.load(src).fingerprint
    # a command's --data: the same run as from the folder itself
    monkeypatch.chdir(tmp_path)
    res = run_cli("retrieval", "baseline", "random", "--data", "psr-test/tiny", "--out", tmp_path / "r.parquet")
    assert res.code == 0, res.text
    a, b = read_run(tmp_path / "r.parquet"), read_run(cli_world["run"])
    assert a.query_ids == b.query_ids and a.topk_ids == b.topk_ids and a.fingerprint == b.fingerprint
    assert np.array_equal(a.topk_scores, b.topk_scores)
    # an existing folder wins over the id it spells
    local = tmp_path / "psr-test" / "tiny"
    local.mkdir(parents=True)
    assert resolve_data("psr-test/tiny") == Path("psr-test/tiny")


@pytest.mark.parametrize("command", sorted(DATA_COMMANDS) + [f"distill {s}" for s in sorted(DISTILL_DATA_COMMANDS)])
def test_every_data_option_names_an_uncached_id_and_how_to_fetch_it(command, hub_cache, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = (["distill", command.split()[1], *DISTILL_DATA_COMMANDS[command.split()[1]]]
            if command.startswith("distill ") else DATA_COMMANDS[command])
    res = run_cli(*args, "--data", "psr-test/absent@v1")
    assert res.code == 2 and "Traceback" not in res.text, res.text
    text = " ".join(res.err.replace("│", " ").split())
    assert "psr-test/absent@v1: no such directory, and the Hub dataset psr-test/absent@v1 is not in the local " \
           f"cache ({hub_cache}) while the Hub is offline (HF_HUB_OFFLINE=1)" in text, text
    assert "hf download psr-test/absent --repo-type dataset --revision v1" in text, text
    assert list(tmp_path.iterdir()) == [hub_cache.parent]  # nothing written


@pytest.mark.slow
def test_a_fresh_process_resolves_the_id_from_hf_home(cli_world, tmp_path):
    """The real entry point and environment: HF_HOME locates the cache, HF_HUB_OFFLINE=1 keeps it off the network."""
    cache_dataset(tmp_path / "hf" / "hub", "psr-test/tiny", folder_files(cli_world["bench"]), COMMIT_A)
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
    env.pop("HF_HUB_CACHE", None)
    r = subprocess.run([sys.executable, "-m", "eval", "validate", "psr-test/tiny"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "valid" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "eval", "validate", "psr-test/other"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "hf download psr-test/other --repo-type dataset" in r.stderr, r.stderr


# --- push ---------------------------------------------------------------------------------------------------------

@pytest.fixture
def hub_calls(monkeypatch):
    """HfApi's repo, branch and upload calls, recorded instead of sent."""
    from huggingface_hub import HfApi

    calls: list[tuple[str, tuple, dict]] = []

    def recorder(name, result=None):
        def call(self, *args, **kw):
            calls.append((name, args, kw))
            return result
        return call

    monkeypatch.setattr(HfApi, "create_repo", recorder("create_repo", "https://huggingface.co/datasets/psr-test/tiny"))
    monkeypatch.setattr(HfApi, "create_branch", recorder("create_branch"))
    monkeypatch.setattr(HfApi, "upload_folder", recorder("upload_folder"))
    return calls


def test_push_uploads_the_validated_benchmark_as_a_dataset_repo(world, hub_calls, hub_cache):
    from huggingface_hub.utils import DEFAULT_IGNORE_PATTERNS, filter_repo_objects

    from eval.benchmark import Benchmark
    from eval.outputs import write_marker

    bench = world["bench"]
    Benchmark.load(bench)  # writes its Arrow cache into bench/.cache/
    write_marker(bench, "eval synth")
    assert (bench / ".cache").is_dir() and (bench / ".psr-output.json").is_file()
    res = run_cli("eval", "push", bench, "psr-test/tiny", "--private", "--revision", "v1")
    assert res.code == 0, res.text
    assert [c[0] for c in hub_calls] == ["create_repo", "create_branch", "upload_folder"]
    (_, args, kw) = hub_calls[0]
    assert args == ("psr-test/tiny",) and kw == {"repo_type": "dataset", "private": True, "exist_ok": True}
    assert hub_calls[1][1:] == (("psr-test/tiny",), {"branch": "v1", "repo_type": "dataset", "exist_ok": True})
    up = hub_calls[2][2]
    assert (up["repo_id"], up["folder_path"], up["repo_type"], up["revision"]) == \
           ("psr-test/tiny", str(bench), "dataset", "v1")
    # what upload_folder sends: the folder's files under the patterns it was given (plus its own defaults)
    every = sorted(p.relative_to(bench).as_posix() for p in bench.rglob("*") if p.is_file())
    sent = list(filter_repo_objects(every, ignore_patterns=[*up["ignore_patterns"], *DEFAULT_IGNORE_PATTERNS]))
    assert sent == upload_list(bench)
    assert {"manifest.json", "queries.jsonl", "corpus.jsonl", "states.jsonl"} <= set(sent)
    assert any(s.startswith("features/pixels/") for s in sent) and any(s.startswith("frames/") for s in sent)
    assert not [s for s in sent if s.startswith(".cache/") or s == ".psr-output.json"]
    assert sorted(set(every) - set(sent)) == sorted(s for s in every if s.startswith(".cache/")) + [".psr-output.json"]
    assert f"pushed {len(sent)} file(s)" in res.out and "--data psr-test/tiny@v1" in res.out
    # what was sent, pulled back through the cache, is the same benchmark
    cache_dataset(hub_cache, "psr-test/tiny", folder_files(bench, sent), COMMIT_A, refs=("v1",))
    assert Benchmark.load("psr-test/tiny@v1").fingerprint == Benchmark.load(bench).fingerprint


@pytest.mark.parametrize("damage", ["bad-record", "missing-frame", "frame-outside", "bad-id"])
def test_push_refuses_before_any_hub_call(world, hub_calls, tmp_path, damage):
    bench = world["bench"]
    repo_id = "psr-test/tiny"
    if damage == "bad-record":
        lines = (bench / "queries.jsonl").read_text().splitlines()
        lines[2] = json.dumps({**json.loads(lines[2]), "horizon": "soon"})
        (bench / "queries.jsonl").write_text("\n".join(lines) + "\n")
        needle = "does not validate"
    elif damage == "missing-frame":
        next((bench / "frames").rglob("*.png")).unlink()
        needle = "does not validate"
    elif damage == "frame-outside":
        corpus = [json.loads(x) for x in (bench / "corpus.jsonl").read_text().splitlines()]
        outside = tmp_path / "elsewhere.png"
        outside.write_bytes((bench / corpus[0]["frame"]).read_bytes())
        corpus[0]["frame"] = str(outside)
        (bench / "corpus.jsonl").write_text("".join(json.dumps(c) + "\n" for c in corpus))
        needle = "frame path(s) point outside the folder"
    else:
        repo_id = "psr-test/tiny@v1"
        needle = "is not a Hub repo id"
    res = run_cli("eval", "push", bench, repo_id)
    assert_one_clear_error(res, needle)
    assert hub_calls == []


def test_push_reports_an_unreachable_or_refusing_hub_as_one_clear_error(world, monkeypatch):
    """Offline, HfApi's real create_repo raises OfflineModeIsEnabled; a refusal (401) comes back as HfHubHTTPError."""
    import httpx2
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import HfHubHTTPError

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    res = run_cli("eval", "push", world["bench"], "psr-test/tiny")
    assert_one_clear_error(res, "not pushed to the Hub dataset psr-test/tiny: the Hub is offline (HF_HUB_OFFLINE=1)")

    def refuse(self, *args, **kw):
        request = httpx2.Request("POST", "https://huggingface.co/api/repos/create")
        raise HfHubHTTPError("401 Unauthorized: invalid token", response=httpx2.Response(401, request=request))

    monkeypatch.setattr(HfApi, "create_repo", refuse)
    res = run_cli("eval", "push", world["bench"], "psr-test/tiny")
    assert_one_clear_error(res, "the Hub answered 401", "hf auth login")
