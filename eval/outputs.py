"""Output safety: a command replaces only what this toolkit wrote for the same kind of output.

Every output directory holds a marker file, ``.psr-output.json``::

    {"marker": 1, "kind": "eval report", "toolkit": "psr-toolkit", "version": "0.1.0"}

``kind`` names the output (usually the command that writes it). Before a command writes ``--out`` it checks the
target (`check_output_dir`, `check_output_file`), in this order:

1. never the current directory or a folder above it (``--out .``); never a path that is or contains anything an
   input of the job reaches (``eval report runs/*.parquet --out runs``, ``eval score --data B --out B``): the input,
   every link target of it (a linked input, and the links at a benchmark's layout points, ``frames``, ``sim``,
   ``features/<space>``: `layout_links`) and the folders its manifest records as ``dependencies``; never what a
   benchmark that is no input links to (it registered itself in the target's `DEPENDENTS` file) -- not even with
   ``overwrite``. Inside any of these (``--out B/report``) only a new path or an earlier output of the same kind,
   never anything else (``--out B/features`` is refused even with ``overwrite``);
2. a missing path or an empty directory is free (for a file output: a missing path or a zero-byte file);
3. a directory whose marker names the same ``kind`` is ours: it is replaced (atomic outputs, `eval.io.atomic_dir`) or
   resumed (in-place outputs, `claim_dir`). Without a marker, ``recognise`` may identify a directory of ``kind`` by
   its content (e.g. a synthetic build's manifest name); it then counts as marked;
4. anything else -- another kind, no marker, a file where a folder goes -- raises `OutputRefused` naming the path and
   the fix, unless ``overwrite`` (the command's ``--overwrite``). A folder where a file goes is always refused.

Single-file outputs (a run, a phrase file, a JSON report) carry no marker: ``recognise(path)`` decides from the
file's own metadata (a run's ``psr_run`` schema metadata, the first line of a phrase file).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from eval.atomic import write_json
from eval.errors import OutputRefused

MARKER = ".psr-output.json"
MARKER_VERSION = 1
TOOLKIT = "psr-toolkit"

#: ``recognise``: file names that together identify an unmarked directory of this kind, or a predicate on the path.
Recognise = Sequence[str] | Callable[[Path], bool] | None

#: Output kinds written by more than one command: a message names every command that writes the kind (a user who ran
#: ``eval score`` is not told about an output "of `eval report`").
KIND_COMMANDS = {"eval report": ("eval score", "eval report")}

_FIX_NEW = "choose a new {option}"
_FIX_FORCE = "choose a new {option}, or pass --overwrite to replace it"


def kind_label(kind: str) -> str:
    """How messages name an output kind: the command(s) that write it, e.g. "`eval score` or `eval report`"."""
    return " or ".join(f"`{c}`" for c in KIND_COMMANDS.get(kind, (kind,)))


def toolkit_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(TOOLKIT)
    except PackageNotFoundError:
        return "unknown"


def write_marker(directory: str | os.PathLike, kind: str, *, written: dict | None = None) -> None:
    """Write the marker of ``kind`` into ``directory`` (atomically: a reader never sees half a marker). ``written``:
    what the command wrote there (`written_listing`), so that a rerun replaces only that (`files_not_written`)."""
    write_json(Path(directory) / MARKER, {"marker": MARKER_VERSION, "kind": kind, "toolkit": TOOLKIT,
                                          "version": toolkit_version(), **({"written": written} if written else {})})


#: Top-level names the toolkit writes into a folder besides a command's output (the loader's Arrow cache; with
#: `DEPENDENTS` and the marker): never a user's file.
HOUSEKEEPING = (".cache",)
#: Up to this many files a marker lists every file the command wrote; above it, its top-level entries.
WRITTEN_LIST_MAX = 20_000


def _files(root: Path, limit: int | None = None) -> list[str] | None:
    """Relative paths of the files (and links) under ``root``, links not followed; None beyond ``limit`` files."""
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            out.append((rel / name).as_posix())
        if limit is not None and len(out) > limit:
            return None
    return sorted(x for x in out if x != MARKER)


def written_listing(directory: str | os.PathLike) -> dict:
    """``{"files": [...]}`` (every file, relative), or ``{"top": [...]}`` (top-level names) for a folder of more than
    `WRITTEN_LIST_MAX` files: what a command wrote into its output folder."""
    d = Path(directory)
    files = _files(d, WRITTEN_LIST_MAX)
    if files is not None:
        return {"files": files}
    return {"top": sorted(e.name for e in os.scandir(d) if e.name != MARKER)}


def files_not_written(directory: str | os.PathLike, new_output: str | os.PathLike) -> list[str]:
    """Relative paths in ``directory`` (an earlier output of the same kind) that its command did not write: files a
    user added. A marker without a listing counts everything the ``new_output`` does not hold again as the
    user's."""
    d = Path(directory)
    written = (read_marker(d) or {}).get("written") or {}
    ours = {MARKER, DEPENDENTS, *HOUSEKEEPING}
    if "top" in written:
        top = set(written["top"])
        return sorted(e.name for e in os.scandir(d) if e.name not in ours and e.name not in top)
    mine = set(written["files"]) if "files" in written else set(_files(Path(new_output)) or ())
    return [f for f in (_files(d) or ()) if f not in mine and f.split("/")[0] not in ours]


def read_marker(directory: str | os.PathLike) -> dict | None:
    """The marker of ``directory`` (None when it has none or it is unreadable)."""
    p = Path(directory) / MARKER
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) and isinstance(d.get("kind"), str) else None


def _resolved(p: str | os.PathLike) -> Path:
    return Path(os.path.abspath(Path(p).expanduser())).resolve()


#: A folder that other benchmarks link into lists them here (`register_dependent`), so a command about to replace
#: it knows what the replacement would break, even when none of them is an input of the job.
DEPENDENTS = ".psr-dependents.json"


def layout_links(root: str | os.PathLike) -> list[tuple[str, Path]]:
    """``(relative name, link path)`` of the symbolic links at the places a benchmark directory links its data from
    elsewhere: its top level (``frames``, ``sim``, ...) and ``features/<space>``. A folder's other levels are not
    scanned (``frames/`` of the PSR release holds 400k files)."""
    root = Path(root)
    out = []
    for base in (root, root / "features"):
        if base.is_symlink() and base != root or not base.is_dir():
            continue
        with contextlib.suppress(OSError), os.scandir(base) as it:
            for e in it:
                if e.is_symlink():
                    out.append((Path(e.path).relative_to(root).as_posix(), Path(e.path)))
    return sorted(out)


def manifest_dependencies(root: str | os.PathLike) -> list[dict]:
    """The ``dependencies`` a benchmark directory's manifest records (`dependency_record`); [] when it records none
    or has no readable manifest."""
    try:
        d = json.loads((Path(root) / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    deps = d.get("dependencies") if isinstance(d, dict) else None
    return [x for x in deps if isinstance(x, dict) and isinstance(x.get("path"), str)] if isinstance(deps, list) \
        else []


def manifest_sha256(folder: str | os.PathLike) -> str | None:
    """SHA-256 of ``folder/manifest.json`` (None when it has none): which build of a folder a dependent linked."""
    import hashlib

    try:
        return hashlib.sha256((Path(folder) / "manifest.json").read_bytes()).hexdigest()
    except OSError:
        return None


def dependency_record(source: str | os.PathLike, links: Sequence[str]) -> dict:
    """The manifest entry of a benchmark that links ``links`` (names relative to itself) into ``source``:
    ``{"path": resolved source, "manifest_sha256": its manifest's hash now, "links": [...]}``."""
    src = _resolved(source)
    return {"path": str(src), "manifest_sha256": manifest_sha256(src), "links": sorted(links)}


def link_dependencies(root: str | os.PathLike) -> list[dict]:
    """`dependency_record` per folder the `layout_links` of ``root`` land in (the nearest folder above each target
    holding a ``manifest.json``, else the target's parent folder): what a benchmark that links its data records in
    its manifest."""
    by_source: dict[Path, list[str]] = {}
    for name, link in layout_links(root):
        target = _resolved(link)
        src = next((a for a in target.parents if (a / "manifest.json").is_file()), target.parent)
        by_source.setdefault(src, []).append(name)
    return [dependency_record(src, names) for src, names in sorted(by_source.items())]


def reached_paths(inp: str | os.PathLike) -> list[tuple[Path, str | None]]:
    """What an input of a job reaches, as ``(resolved path, how)``: the input itself (a link followed to its
    target), and for a directory the targets of its `layout_links` and the folders its manifest records as
    dependencies (`manifest_dependencies`); ``how`` is None for the input itself. Missing paths are left out."""
    out: list[tuple[Path, str | None]] = [(_resolved(inp), None)]
    if Path(inp).is_dir():
        for dep in manifest_dependencies(inp):
            if os.path.exists(dep["path"]):
                out.append((_resolved(dep["path"]), f"the input {inp} was built from it and links into it"))
        for name, link in layout_links(inp):
            if link.exists():
                out.append((_resolved(link), f"the input {inp} reaches it through the link {name}"))
    return out


def _ancestors_and_children(p: Path, depth: int = 2) -> Iterator[Path]:
    """``p``, the folders above it, and the real (not linked) folders below it down to ``depth`` levels."""
    yield from (p, *p.parents)
    level = [p] if p.is_dir() else []
    for _ in range(depth):
        nxt = []
        for d in level:
            with contextlib.suppress(OSError), os.scandir(d) as it:
                nxt += [Path(e.path) for e in it if e.is_dir(follow_symlinks=False)]
        yield from nxt
        level = nxt


def live_dependents(folder: str | os.PathLike) -> list[Path]:
    """The benchmarks registered in ``folder``'s `DEPENDENTS` file that still depend on it: they exist and their
    manifest records ``folder`` as a dependency."""
    f = _resolved(folder)
    try:
        listed = json.loads((f / DEPENDENTS).read_text(encoding="utf-8")).get("dependents", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [Path(d) for d in listed if isinstance(d, str) and os.path.isdir(d)
            and any(_resolved(x["path"]) == f for x in manifest_dependencies(d))]


def _dependents_reach(out: Path) -> Iterator[tuple[Path, str]]:
    """What benchmarks that are no input of the job reach, where they depend on ``out``, a folder above or one below
    it (`live_dependents` of each folder with a `DEPENDENTS` file)."""
    for folder in _ancestors_and_children(out):
        if not (folder / DEPENDENTS).is_file():
            continue
        for dep in live_dependents(folder):
            yield _resolved(folder), f"the benchmark {dep} links into it"
            for name, link in layout_links(dep):
                if link.exists() and _resolved(link).is_relative_to(_resolved(folder)):
                    yield _resolved(link), f"the benchmark {dep} links to it ({name})"


def register_dependent(folder: str | os.PathLike, dependent: str | os.PathLike) -> bool:
    """Record in ``folder``'s `DEPENDENTS` file that the benchmark ``dependent`` links into it (idempotent; entries
    that no longer depend on it are dropped). Returns False when ``folder`` is read-only."""
    f, dep = _resolved(folder), str(_resolved(dependent))
    keep = [str(d) for d in live_dependents(f) if str(d) != dep]
    try:
        write_json(f / DEPENDENTS, {"dependents": sorted([*keep, dep])})
    except OSError:
        return False
    return True


def release_dependent(folder: str | os.PathLike, dependent: str | os.PathLike) -> None:
    """Drop ``dependent`` from ``folder``'s `DEPENDENTS` file: a job that is about to rebuild both (``retrieval
    synth``) lets the folder be replaced; the dependent then refuses to load until it is rebuilt
    (`eval.validate.link_problems`)."""
    f, dep = _resolved(folder), _resolved(dependent)
    if (f / DEPENDENTS).is_file():
        write_json(f / DEPENDENTS, {"dependents": sorted(str(d) for d in live_dependents(f) if d != dep)})


def check_not_inputs(path: str | os.PathLike, inputs: Iterable[str | os.PathLike | None] = (), *,
                     option: str = "--out") -> Path | None:
    """Refuse an output path that is the current directory (or above it), or that is or contains anything an input
    reaches (`reached_paths`: the inputs, the targets of their links, the folders they were built from; None
    entries and paths that do not exist are skipped), or anything that a benchmark which is no input links to
    (`live_dependents` of ``path``, a folder above or below it). ``overwrite`` never lifts this. Returns the
    protected directory ``path`` lies inside (None if none): there, only a missing target or an earlier output of
    the same kind may be written, never anything else (not even with ``overwrite``)."""
    out = _resolved(path)
    cwd = Path.cwd().resolve()
    if cwd == out or cwd.is_relative_to(out):
        raise OutputRefused(f"{option} {path} is the current directory or a folder above it; an output folder is "
                            "replaced as a whole", fix=f"pass a new sub-folder, e.g. {option} {Path(path) / 'out'}")
    inside = None
    for reached, label, how in _protected(out, inputs):
        if out == reached or reached.is_relative_to(out):
            if how is None:  # an input itself
                what = "is" if out == reached else "contains"
                raise OutputRefused(f"{option} {path} {what} an input of this job ({label}); it is never replaced, "
                                    "not even with --overwrite",
                                    fix=_FIX_NEW.format(option=option) + " outside the inputs")
            what = "is" if out == reached else f"contains {reached}, which is"
            raise OutputRefused(f"{option} {path} {what} data a benchmark depends on ({how}); it is never replaced, "
                                "not even with --overwrite",
                                fix=_FIX_NEW.format(option=option) + " outside what the inputs and benchmarks link to")
        if out.is_relative_to(reached) and reached.is_dir() and inside is None:
            inside = Path(label)
    return inside


def _protected(out: Path, inputs: Iterable) -> Iterator[tuple[Path, str, str | None]]:
    """``(resolved path, label for messages, how it is reached: None for an input itself)`` of everything
    `check_not_inputs` protects."""
    for inp in inputs:
        if inp is None or str(inp) == "" or not os.path.lexists(inp):
            continue  # a model id, an unset option: nothing on disk to protect
        for reached, how in reached_paths(inp):
            yield (reached, str(inp), None) if how is None else (reached, str(reached), how)
    for reached, how in _dependents_reach(out):
        yield reached, str(reached), how


def _inside_refusal(path, inside: Path, option: str, what: str) -> OutputRefused:
    return OutputRefused(f"{option} {path} {what}, inside an input of this job or data a benchmark links to "
                         f"({inside}); only a new path or an earlier output of the same command is written there, "
                         "not even --overwrite replaces anything else",
                         fix=_FIX_NEW.format(option=option) + " outside the inputs")


def _recognised(p: Path, recognise: Recognise) -> bool:
    if recognise is None:
        return False
    if callable(recognise):
        try:
            return bool(recognise(p))
        except Exception:  # a recogniser that cannot read the folder does not recognise it
            return False
    return bool(recognise) and all((p / name).exists() for name in recognise)


def check_output_dir(path: str | os.PathLike, kind: str | None, *, inputs: Iterable = (), overwrite: bool = False,
                     recognise: Recognise = None, option: str = "--out") -> Path:
    """Check that the directory ``path`` may receive an output of ``kind`` (module docstring); returns ``path``.

    ``kind`` None: only a missing or empty directory is free (or any, with ``overwrite``). Raises `OutputRefused`.
    """
    p = Path(path)
    inside = check_not_inputs(p, inputs, option=option)
    if not p.exists() and not p.is_symlink():
        return p
    force = _FIX_FORCE.format(option=option)
    if not p.is_dir():
        if inside is not None:
            raise _inside_refusal(path, inside, option, "is a file")
        if overwrite:
            return p
        raise OutputRefused(f"{option} {path} is a file, not an output folder" +
                            (f" of {kind_label(kind)}" if kind else ""), fix=force)
    # a marker being written by a concurrent claim of the same folder (another rank of a distributed job) is its
    # temporary file `.{MARKER}.*` (eval.atomic.atomic_path): it does not make the folder someone else's
    if not any(not x.name.startswith(f".{MARKER}.") for x in p.iterdir()) and inside is None:
        return p
    marker = read_marker(p)
    if kind is not None and marker is not None and marker["kind"] == kind:
        return p
    if kind is not None and marker is None and _recognised(p, recognise):
        return p
    if inside is not None:
        raise _inside_refusal(path, inside, option, "exists and is not an earlier output of this command")
    if overwrite:
        return p
    if marker is not None:
        what = f"holds the output of {kind_label(marker['kind'])}" + (f", not of {kind_label(kind)}" if kind else "")
    else:
        what = "is not empty and was not written by this toolkit" + (f" for {kind_label(kind)}" if kind else "") + \
               f" (no {MARKER})"
    raise OutputRefused(f"{option} {path} {what}", fix=force)


def check_output_file(path: str | os.PathLike, kind: str, *, recognise: Callable[[Path], bool] | None,
                      inputs: Iterable = (), overwrite: bool = False, option: str = "--out") -> Path:
    """Check that the file ``path`` may receive an output of ``kind``: missing, zero bytes, recognised as ours by
    ``recognise(path)``, or ``overwrite``; a directory is always refused. Returns ``path``."""
    p = Path(path)
    inside = check_not_inputs(p, inputs, option=option)
    if not p.exists() and not p.is_symlink():
        return p
    if p.is_dir():
        raise OutputRefused(f"{option} {path} is a directory; {kind} output is a file",
                            fix=f"pass a file path, e.g. {option} {p / ('out' + p.suffix)}")
    if p.is_file() and p.stat().st_size == 0 and inside is None:
        return p
    if recognise is not None:
        try:
            if recognise(p):
                return p
        except Exception:  # unreadable as our format: not recognised
            pass
    if inside is not None:
        raise _inside_refusal(path, inside, option, f"exists and is not a {kind} file written by this toolkit")
    if overwrite:
        return p
    raise OutputRefused(f"{option} {path} exists and is not a {kind} file written by this toolkit",
                        fix=_FIX_FORCE.format(option=option))


def claim_dir(path: str | os.PathLike, kind: str, *, inputs: Iterable = (), overwrite: bool = False,
              recognise: Recognise = None, option: str = "--out") -> Path:
    """For outputs written in place (resumable jobs: checkpoints, encoded spaces, narration): check ``path`` as
    `check_output_dir`, create it and write the marker. Returns ``path``. Files already there are kept (a resumed
    job reads them); the job replaces only the files it writes."""
    p = check_output_dir(path, kind, inputs=inputs, overwrite=overwrite, recognise=recognise, option=option)
    if (p.is_symlink() and not p.exists()) or (p.exists() and not p.is_dir()):
        p.unlink()  # a file (or a dangling link) where the folder goes: check_output_dir allowed it (overwrite)
    p.mkdir(parents=True, exist_ok=True)
    if (read_marker(p) or {}).get("kind") != kind:
        write_marker(p, kind)
    return p


@contextlib.contextmanager
def claimed_dir(path: str | os.PathLike, kind: str, *, inputs: Iterable = (), overwrite: bool = False,
                recognise: Recognise = None, option: str = "--out") -> Iterator[Path]:
    """`claim_dir` for the duration of a job: should the job fail before writing anything, the folder it created
    (holding only the marker) is removed again, so a failed job leaves nothing behind."""
    created = not os.path.lexists(path)
    p = claim_dir(path, kind, inputs=inputs, overwrite=overwrite, recognise=recognise, option=option)
    try:
        yield p
    except BaseException:
        if created and [x.name for x in p.iterdir()] == [MARKER]:
            (p / MARKER).unlink()
            with contextlib.suppress(OSError):
                p.rmdir()
        raise


# --- recognisers of single-file outputs (by their own content; cheap: they read a header or a first line) ---

def first_jsonl_object(path: Path, limit: int = 1 << 20) -> dict | None:
    """The first non-empty line of a JSONL file as an object (None when it is not one)."""
    with open(path, "rb") as f:
        for raw in f:
            if raw.strip():
                try:
                    d = json.loads(raw[:limit])
                except (ValueError, UnicodeDecodeError):
                    return None
                return d if isinstance(d, dict) else None
    return None


def jsonl_with_keys(*keys: str) -> Callable[[Path], bool]:
    """Recogniser: the first line of the file is a JSON object holding every key in ``keys``."""
    def recognise(path: Path) -> bool:
        d = first_jsonl_object(path)
        return d is not None and all(k in d for k in keys)
    return recognise


def json_with_keys(*keys: str) -> Callable[[Path], bool]:
    """Recogniser: the file is a JSON object holding every key in ``keys``."""
    def recognise(path: Path) -> bool:
        if path.stat().st_size > (64 << 20):
            return False
        d = json.loads(path.read_text(encoding="utf-8"))
        return isinstance(d, dict) and all(k in d for k in keys)
    return recognise
