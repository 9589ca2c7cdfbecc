"""Benchmarks on the Hugging Face Hub: ``--data`` takes a dataset repo id (``python -m eval push`` uploads one:
`eval.push`).

``--data`` (every command; `eval.cli_support.check_benchmark_dir` and `eval.benchmark.Benchmark.load` call
`resolve_data`) is read as follows:

1. a path that exists is used as it is (a directory; anything else gets the usual "not a benchmark directory");
2. otherwise ``owner/name`` or ``owner/name@revision`` (a branch, tag or commit) is a Hub *dataset* repo:
   ``huggingface_hub.snapshot_download(repo_id, repo_type="dataset", revision=...)`` returns its snapshot folder in
   the Hub cache (``$HF_HOME/hub/datasets--owner--name/snapshots/<commit>/``), downloading what is missing. Offline
   (``HF_HUB_OFFLINE=1``, or the Hub unreachable) it resolves from the cache alone (``refs/<revision>`` names the
   commit) or raises `InputError` saying the id is not cached and how to fetch it;
3. anything else is left to the directory check ("does not exist").

The snapshot is a benchmark directory like any other: jobs read it in place (the Arrow cache of
`eval.benchmark` goes into its ``.cache/`` when the Hub cache is writable, else the `datasets` default cache).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from eval.errors import InputError

#: ``owner/name`` or ``owner/name@revision``.
HUB_ID = re.compile(r"(?P<repo_id>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[^\s@]+))?")


@dataclass(frozen=True)
class HubDataset:
    """A dataset repo on the Hub and the revision asked for (None: the default branch)."""

    repo_id: str
    revision: str | None = None

    def __str__(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")

    def download_command(self) -> str:
        return f"hf download {self.repo_id} --repo-type dataset" + (f" --revision {self.revision}" if self.revision else "")


def parse_hub_id(value: str) -> HubDataset | None:
    """``owner/name[@revision]`` as a `HubDataset`; None when ``value`` is not a valid Hub repo id."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    m = HUB_ID.fullmatch(str(value))
    if m is None:
        return None
    try:
        validate_repo_id(m["repo_id"])
    except HFValidationError:
        return None
    return HubDataset(m["repo_id"], m["revision"])


def resolve_data(value: str | os.PathLike, option: str = "--data") -> Path:
    """The local folder of a ``--data`` value: the path itself when it exists, else the snapshot folder of the Hub
    dataset it names (module docstring); a value that is neither comes back unchanged (as a `Path`)."""
    path = Path(value)
    if os.path.lexists(path):
        return path
    ref = parse_hub_id(str(value))
    return path if ref is None else snapshot(ref, option)


def snapshot(ref: HubDataset, option: str = "--data") -> Path:
    """The snapshot folder of the Hub dataset ``ref`` (downloaded, or from the cache offline); `InputError` when it
    can be neither."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    head = f"{option} {ref}".strip() + ": no such directory"
    try:
        return Path(snapshot_download(ref.repo_id, repo_type="dataset", revision=ref.revision))
    except IncompleteSnapshotError:  # a LocalEntryNotFoundError: first
        raise InputError(f"{head}, and the cached snapshot of the Hub dataset {ref} is incomplete",
                         fix=f"complete it with `{ref.download_command()}`") from None
    except LocalEntryNotFoundError:
        why = "the Hub is offline (HF_HUB_OFFLINE=1)" if constants.HF_HUB_OFFLINE else "the Hub could not be reached"
        raise InputError(f"{head}, and the Hub dataset {ref} is not in the local cache ({constants.HF_HUB_CACHE}) "
                         f"while {why}", fix=f"fetch it where the Hub is reachable with `{ref.download_command()}` "
                                             f"(same HF_HOME), or pass a benchmark directory") from None
    except RevisionNotFoundError:
        raise InputError(f"{head}, and the Hub dataset {ref.repo_id} has no revision {ref.revision!r}",
                         fix="pass an existing branch, tag or commit after @") from None
    except (GatedRepoError, RepositoryNotFoundError):
        raise InputError(f"{head}, and there is no Hub dataset {ref.repo_id} that this account can read",
                         fix="check the id, or log in with `hf auth login` for a private or gated dataset") from None
