"""Shared fixtures. Nothing here downloads: models are built tiny into temp dirs, data is synthesised."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MPLBACKEND", "Agg")

#: Size of the session's synthetic benchmark: big enough for every tier, horizon and question type.
SYNTH_VIDEOS = int(os.environ.get("PSR_TEST_SYNTH_VIDEOS", "80"))
#: Where the session's synthetic benchmarks are built and, on a later run, reused (default: a fresh temp dir each
#: session). For a machine that cannot build them: a GPU node without the packaged MiniLM gets a folder built here
#: (scripts/gpu_tests.sh). A build of another size or seed there is refused, never replaced.
SYNTH_HOME = os.environ.get("PSR_TEST_SYNTH_DIR")
#: The inner loop's cache of those builds (`make test-fast` sets it): one folder per `build_key` below it, so a
#: rerun with the same builder code, packages and size reuses the last build and a change to any of them builds
#: anew; the cache keeps the `KEPT_KEYS` most recently used builds and removes older ones it wrote.
SYNTH_CACHE = os.environ.get("PSR_TEST_SYNTH_CACHE")
KEPT_KEYS = 2
REPO = Path(__file__).resolve().parents[1]


#: Test folders whose tiny models run fastest on one torch thread: on 2 busy cores two threads contend
#: (measured up to 7x slower forwards).
ONE_THREAD_DIRS = ("forecasters", "distill")


#: Set by pytest-xdist in its workers: ``make test`` runs every test in two worker processes, one per core.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
#: Markers of the tests that take minutes (or wait for a server): under xdist they run before the quick ones.
LONG_MARKS = ("slow", "vllm", "gpu")
#: The test files of the background vLLM jobs of `tests/forecasters/conftest.py` (the architecture job; the
#: in-process runs and the served model, whose tests overlap), the longest first. Under ``make test``
#: (``--dist loadgroup``) each job's files form one scope that one worker runs (`pytest_xdist_make_scheduler`), so
#: each job runs once per session, in that worker.
BACKGROUND_JOBS = {"vllm-arch": ("test_fc_architectures.py",),
                   "vllm": ("test_fc_vllm_inprocess.py", "test_fc_likelihood.py", "test_fc_faults.py",
                            "test_fc_openai_server.py")}
#: The fixtures that start each job (a test that uses one must be in that job's files).
BACKGROUND_FIXTURES = {"arch_runs": "vllm-arch", "vllm_inprocess_runs": "vllm", "_vllm_handle": "vllm"}


def background_job(nodeid: str) -> str | None:
    """The `BACKGROUND_JOBS` entry whose files hold the test ``nodeid``, if any."""
    name = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    return next((job for job, files in BACKGROUND_JOBS.items() if name in files), None)


def background_job_scheduling():
    """xdist's load scheduling by scopes with one scope per background job (its files) and one per other test."""
    from xdist.scheduler import LoadScopeScheduling

    class BackgroundJobScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return background_job(nodeid) or nodeid

    return BackgroundJobScheduling


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup``: `background_job_scheduling`, handing the scopes out in collection order with
    ``--no-loadscope-reorder``. xdist's own loadgroup reads ``xdist_group`` marks by renaming node ids, which pytest 9
    ignores (it keeps ids elsewhere than ``_nodeid``), so it would spread a job's tests over both workers and start
    the job in each."""
    if config.getoption("dist") != "loadgroup":
        return None
    return background_job_scheduling()(config, log)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """Under xdist (``make test``), the order in which the workers take the tests: the architecture job's tests
    first (its job is the longest: one worker waits for it while the other runs slow tests), then the slow tests
    (the other background jobs' tests among them), then the quick ones, so the two workers end together instead of
    one finishing a long test alone; the quick ones in `_builder_first`'s order. In one process the order stays as
    collected (with the architecture tests last, `tests/forecasters/conftest.py`)."""
    if not XDIST_WORKER:
        return
    first = next(iter(BACKGROUND_JOBS))

    def rank(it) -> int:
        if background_job(it.nodeid) == first:
            return 0
        return 1 if any(it.get_closest_marker(m) is not None for m in LONG_MARKS) else 2

    items.sort(key=rank)  # stable
    quick = next((i for i, it in enumerate(items) if rank(it) == 2), len(items))
    items[quick:] = _builder_first(items[quick:], len(items) // 2 - quick)


#: The session fixtures that one worker builds while the other waits for it (`_building`).
SHARED_BUILDS = ("synth_truth_dir", "synth_dir")


def _builder_first(items: list, half: int) -> list:
    """The quick tests reordered so that each worker starts with work while the shared benchmark is being built:
    xdist hands each worker one contiguous half of the order (``--dist worksteal``, `make test-fast`), so the first
    ``half`` items (at most) are modules that need no `SHARED_BUILDS` fixture, and the modules that need one come
    right after them, at the head of the other worker's half; the other modules follow. A module moves whole, its
    tests in their order, so its module-scoped fixtures are set up once."""
    modules: dict[str, list] = {}
    for it in items:
        modules.setdefault(it.nodeid.split("::", 1)[0], []).append(it)
    builds = [any(set(SHARED_BUILDS) & set(it.fixturenames) for it in m) for m in modules.values()]
    needs = [m for m, b in zip(modules.values(), builds, strict=True) if b]
    free = [m for m, b in zip(modules.values(), builds, strict=True) if not b]
    head, n = [], 0
    while free and n + len(free[0]) <= half:
        head.append(free.pop(0))
        n += len(head[-1])
    return [it for m in head + needs + free for it in m]


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread(request):
    if not XDIST_WORKER and Path(str(request.module.__file__)).parent.name not in ONE_THREAD_DIRS:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def build_key(cache: Path, repo: Path = REPO) -> str:
    """What the session's builds in ``cache`` are made of: the source of the packages that build them (every ``.py``
    file of ``eval/`` and ``retrieval/``), the installed distributions' versions, the Python version, the size, and
    where the cache is (a build links to itself by absolute paths)."""
    import hashlib
    import sys
    from importlib import metadata

    h = hashlib.sha256(f"{SYNTH_VIDEOS} 0 {sys.version} {cache.resolve()}".encode())
    for d in sorted({f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions()}):
        h.update(d.encode())
    for pkg in ("eval", "retrieval"):
        for f in sorted((repo / pkg).rglob("*.py")):
            h.update(str(f.relative_to(repo)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


#: The file that marks a folder of `PSR_TEST_SYNTH_CACHE` as one of its builds: only such folders are ever removed.
CACHE_MARKER = ".psr-test-synth-build"


def _cached_home(cache: Path, key: str) -> Path:
    """``cache / key``, marked as this cache's and as used now; the cache's other builds beyond the `KEPT_KEYS` most
    recently used are removed (only folders holding `CACHE_MARKER`, which `_cached_home` wrote)."""
    import shutil

    home = cache / key
    home.mkdir(parents=True, exist_ok=True)
    (home / CACHE_MARKER).touch()
    with _building(cache):
        others = [d for d in cache.iterdir() if d != home and (d / CACHE_MARKER).is_file()]
        others.sort(key=lambda d: (d / CACHE_MARKER).stat().st_mtime, reverse=True)
        for d in others[KEPT_KEYS - 1:]:
            shutil.rmtree(d, ignore_errors=True)
    return home


def _build_home(tmp_path_factory) -> Path:
    """Where this session builds its synthetic benchmarks: `PSR_TEST_SYNTH_DIR`; else below `PSR_TEST_SYNTH_CACHE`,
    the folder of this session's `build_key`; else, under pytest-xdist, one folder that this run's workers share
    (their base temps have a common parent), so the build happens once; else a fresh temp folder."""
    if SYNTH_HOME:
        return Path(SYNTH_HOME)
    if SYNTH_CACHE:
        return _cached_home(Path(SYNTH_CACHE), build_key(Path(SYNTH_CACHE)))
    if XDIST_WORKER:
        home = tmp_path_factory.getbasetemp().parent / "psr-synth-shared"
        home.mkdir(exist_ok=True)
        return home
    return tmp_path_factory.mktemp("psr-synth")


@contextlib.contextmanager
def _building(home: Path):
    """Hold ``home``'s build lock: one process builds, the others wait and then reuse what it built."""
    from filelock import FileLock

    home.mkdir(parents=True, exist_ok=True)
    with FileLock(str(home / ".build.lock")):
        yield


@pytest.fixture(scope="session")
def synth_truth_dir(tmp_path_factory):
    """Step 1 of the synthetic construction: the simulator-truth benchmark (built once; treat as read-only)."""
    from eval.synth import build_benchmark

    home = _build_home(tmp_path_factory)
    out = home / "psr-synth-truth"
    with _building(home):
        if _kept_build(out, out):
            return out
        return build_benchmark(out, videos=SYNTH_VIDEOS, seed=0, progress=False)


def _kept_build(out: Path, truth: Path) -> bool:
    """``out`` holds a finished build of this session's size (``truth``'s manifest says which); raises when it holds
    another."""
    import json

    if not (out / "manifest.json").exists():
        return False
    extra = json.loads((truth / "manifest.json").read_text()).get("extra", {})
    if (extra.get("videos"), extra.get("seed")) != (SYNTH_VIDEOS, 0):
        raise pytest.UsageError(f"PSR_TEST_SYNTH_DIR: {truth} holds a build of {extra.get('videos')} videos, seed "
                                f"{extra.get('seed')}, not {SYNTH_VIDEOS}, seed 0; point it at another folder")
    return True


@pytest.fixture(scope="session")
def synth_dir(synth_truth_dir):
    """A small synthetic PSR benchmark, built as `python -m retrieval synth` builds the default: the truth build
    canonicalized with the packaged MiniLM at 0.85, GT mined and verified (once per session; treat as read-only)."""
    from retrieval.canon.apply import ApplyConfig, apply_canonicalization
    from retrieval.encoders import PACKAGED_MINILM
    from retrieval.synth import MINE_BUDGET, NAME, THRESHOLD

    out = synth_truth_dir.parent / "psr-synth"
    with _building(synth_truth_dir.parent):
        if _kept_build(out, synth_truth_dir):
            return out
        cfg = ApplyConfig(data=str(synth_truth_dir), out=str(out), threshold=THRESHOLD, model=PACKAGED_MINILM,
                          mine_budget=MINE_BUDGET, verify=True, name=NAME)
        return apply_canonicalization(cfg, progress=False, log=lambda *_: None)


@pytest.fixture
def synth_copy(synth_dir, tmp_path):
    """A private copy of the session's synthetic benchmark for a test whose commands write into their benchmark
    (a semantic space encoded by `distill recipe`, say): its files copied, its frames and spaces linked."""
    import shutil

    d = shutil.copytree(synth_dir, tmp_path / "synth-copy", symlinks=True,
                        ignore=shutil.ignore_patterns("frames", ".cache"))
    (d / "frames").symlink_to(synth_dir / "frames", target_is_directory=True)
    return d


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for d in (root, root / "features") if d.is_dir() for p in d.iterdir()
                  if p.name != ".cache")


@pytest.fixture(autouse=True)
def _shared_benchmarks_stay_read_only(request):
    """A test that writes into the session's shared benchmarks would change what every later test reads: fail it."""
    names = [n for n in ("synth_truth_dir", "synth_dir") if n in request.fixturenames]
    before = {n: _listing(request.getfixturevalue(n)) for n in names}
    yield
    for n in names:
        after = _listing(request.getfixturevalue(n))
        assert after == before[n], (f"the test wrote into the shared `{n}` fixture (treat it as read-only; use "
                                    f"`synth_copy`): {sorted(set(after) ^ set(before[n]))}")


@pytest.fixture(scope="session")
def synth_bench(synth_dir):
    from eval.benchmark import Benchmark

    return Benchmark.load(synth_dir)
