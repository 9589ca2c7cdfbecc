"""Upload a benchmark directory to the Hugging Face Hub as a dataset repo (``python -m eval push``).

`push_benchmark` validates a benchmark directory (`eval.validate`, frame files included) and refuses it on any
error before contacting the Hub; then ``HfApi().create_repo(repo_id, repo_type="dataset", exist_ok=True)`` (and
``create_branch`` for a ``revision`` other than main) and one ``upload_folder`` commit of the folder, without the
toolkit's local files (`LOCAL_ONLY`: the ``.cache/`` folder, the output marker). Frame paths must lie inside the
folder: a benchmark that references frames elsewhere is refused (they would not be uploaded).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from eval.errors import InputError
from eval.hub import parse_hub_id

#: Files of a benchmark directory that are local to one machine and never uploaded (upload_folder patterns).
LOCAL_ONLY = (".cache", ".cache/*", ".psr-output.json")


@dataclass
class PushResult:
    repo_id: str
    revision: str
    url: str
    files: int


def external_frames(bench) -> list[str]:
    """Frame paths of the benchmark's records that lie outside its folder (absolute, or climbing out with ``..``)."""
    root = bench.root.resolve()
    refs = [f for fs in bench.queries_ds["prefix_frames"][:] for f in fs or ()] + list(bench.corpus_ds["frame"][:])
    out = []
    for rel in dict.fromkeys(r for r in refs if r):
        p = Path(rel)
        if p.is_absolute() or ".." in p.parts:
            full = (p if p.is_absolute() else root / p).resolve()
            if not full.is_relative_to(root):
                out.append(rel)
    return out


def push_benchmark(folder: str | os.PathLike, repo_id: str, *, private: bool = False, revision: str | None = None,
                   commit_message: str | None = None, log=print) -> PushResult:
    """Validate ``folder`` and upload it as the Hub dataset ``repo_id`` (module docstring); nothing is sent when it
    does not validate."""
    from eval.benchmark import Benchmark
    from eval.validate import validate

    folder = Path(folder)
    ref = parse_hub_id(repo_id)
    if ref is None or ref.revision:
        raise InputError(f"{repo_id!r} is not a Hub repo id", fix="pass owner/name (the revision goes in --revision)")
    report = validate(folder)
    if not report.ok:
        raise InputError(f"{folder}: not pushed, the benchmark does not validate ({len(report.errors)} error(s); "
                         f"first: {report.errors[0]})", fix=f"`python -m eval validate {folder}` lists every problem")
    outside = external_frames(Benchmark.load(folder))
    if outside:
        raise InputError(f"{folder}: not pushed, {len(outside)} frame path(s) point outside the folder (e.g. "
                         f"{outside[0]!r}) and would not be uploaded",
                         fix="copy the frames into the folder and reference them by relative paths")
    files = len(upload_list(folder))
    with _hub_errors(f"{folder}: not pushed to the Hub dataset {repo_id}"):
        url = _upload(folder, repo_id, private=private, revision=revision, commit_message=commit_message,
                      log=lambda: log(f"uploading {files} file(s) of {folder} to the Hub dataset {repo_id}"
                                      + (f"@{revision}" if revision else "")))
    return PushResult(repo_id, revision or "main", str(url), files)


def _upload(folder: Path, repo_id: str, *, private: bool, revision: str | None, commit_message: str | None,
            log) -> str:
    """create_repo (+ create_branch) + upload_folder; returns the repo's URL."""
    from huggingface_hub import HfApi

    api = HfApi()
    url = api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
    if revision and revision != "main":
        api.create_branch(repo_id, branch=revision, repo_type="dataset", exist_ok=True)
    log()
    api.upload_folder(repo_id=repo_id, folder_path=str(folder), repo_type="dataset", revision=revision,
                      commit_message=commit_message or f"Upload PSR benchmark {folder.name}",
                      ignore_patterns=list(LOCAL_ONLY))
    return str(url)


@contextlib.contextmanager
def _hub_errors(what: str):
    """The Hub's refusals and network failures as one `InputError` line: ``what``, the reason, the fix."""
    import httpx2  # huggingface_hub's HTTP client: its transport errors are not OSErrors
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    login = "log in with a token that may write to it (`hf auth login`, or HF_TOKEN)"
    try:
        yield
    except OfflineModeIsEnabled:
        raise InputError(f"{what}: the Hub is offline (HF_HUB_OFFLINE=1)",
                         fix="run it with HF_HUB_OFFLINE unset where the Hub is reachable") from None
    except HfHubHTTPError as e:
        status = getattr(e.response, "status_code", None)
        raise InputError(f"{what}: the Hub answered {status}: {' '.join(str(e).split())[:300]}", fix=login) from None
    except httpx2.TransportError as e:
        raise InputError(f"{what}: the Hub could not be reached ({type(e).__name__}: {e})",
                         fix="check the network, then push again (an upload that stopped is redone whole)") from None


def upload_list(folder: str | os.PathLike) -> list[str]:
    """The files (relative POSIX paths, sorted) that `push_benchmark` uploads from ``folder``: every file but
    `LOCAL_ONLY` and what ``upload_folder`` always leaves out, selected the way ``upload_folder`` selects them."""
    from huggingface_hub.utils import DEFAULT_IGNORE_PATTERNS, filter_repo_objects

    folder = Path(folder)
    rel = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    return list(filter_repo_objects(rel, ignore_patterns=[*LOCAL_ONLY, *DEFAULT_IGNORE_PATTERNS]))
