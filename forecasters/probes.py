"""Canonicalization probes as phrase sources (PSR appendix, "Forecasting vs. canonicalization" and "Cross-model
description"). Their phrase files are retrieved and scored like any forecaster's (``python -m retrieval search``).

Registered forecasters (run with ``python -m forecasters run --forecaster NAME``, any backend):

- ``paraphrase`` -- the paraphrase oracle: an LLM rewords each query's *true* target state (prompt ``paraphrase``,
  placeholder ``state`` = ``target_state``). The content is right by construction, only the wording changes, so
  its drop from the exact-string oracle is pure canonicalization loss. Default model: the ``text-only`` preset.
- ``describe`` -- the cross-model description probe: a VLM describes, from scratch, the state of the query's object
  in the middle frame of its true target segment (prompt ``frame_description``: ``{frame}`` = that frame,
  ``{subject}`` = the object). The target segment is the query's own future segment: the in-video GT segment of
  the same object that starts at ``target_time`` (else the earliest in-video GT segment of the object, else the
  earliest in-video GT segment). Default model: the ``llava`` preset (LLaVA-1.6-7B, as the paper).

Without a model (``python -m forecasters probes synonyms``): the deterministic paraphrase oracle from exact synonym
sets: the ``members`` of a ``states.jsonl`` (by default the benchmark's own; the synthetic benchmark's are exact).
For query ``q`` with target text ``t``, the candidates are the other phrasings of the synonym set holding ``t`` (file
order; the first set when several do) and the paraphrase is candidate
``int(sha1("<seed>:<query id>")[:8], 16) mod (#candidates)``; a text in no set, or alone in its set, is kept (flag
``no_synonym``). Looking sets up by membership (not by state id) lets the synonym sets of a source benchmark
paraphrase the queries of its re-keyed version (``python -m retrieval canon apply``), whose canonical texts are raw
phrasings of the source.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import typer

from eval.cli_support import data_callback, overwrite_option
from forecasters.registry import ForecasterSpec, PromptInput, register

PARAPHRASE = "paraphrase"
DESCRIBE = "describe"
SYNONYMS = "paraphrase-synonyms"


def paraphrase_inputs(query, bench=None) -> PromptInput:
    """The paraphrase oracle's input: the query's true canonical target state."""
    return PromptInput(values={"state": query.target_state})


def target_segment(query, bench):
    """The query's own target segment (see the module docstring); `ValueError` when its in-video tier is empty."""
    own = [bench.segment(x) for x in query.gt_pools.in_video]
    if not own:
        raise ValueError(f"query {query.id}: its in-video GT tier is empty, so there is no true target segment "
                         "to describe")
    same_object = [s for s in own if s.object_id == query.object_id]
    exact = [s for s in same_object if s.start == query.target_time]
    return (exact or sorted(same_object, key=lambda s: s.start) or sorted(own, key=lambda s: s.start))[0]


def describe_inputs(query, bench) -> PromptInput:
    """The description probe's input: the object's name and the middle frame of its true target segment."""
    seg = target_segment(query, bench)
    return PromptInput(values={"subject": query.subject}, media={"frame": (seg.frame,)})


PROBES = (
    ForecasterSpec(name=PARAPHRASE, prompt="paraphrase", build=paraphrase_inputs, default_model="text-only",
                   description="paraphrase oracle: an LLM rewords the query's true target state (App. U)"),
    ForecasterSpec(name=DESCRIBE, prompt="frame_description", build=describe_inputs, default_model="llava",
                   description="cross-model description: a VLM describes the true target segment's frame (App. U)"),
)
for _spec in PROBES:
    register(_spec)


# --- the deterministic synonym-set paraphraser ---------------------------------------------------------------
def synonym_paraphrase(query_id: str, text: str, members, seed: int = 0) -> tuple[str, list[str]]:
    """``(paraphrase, flags)`` of a state ``text`` with synonym set ``members`` (see the module docstring)."""
    candidates = [m for m in dict.fromkeys(members or ()) if m != text]
    if not candidates:
        return text, ["no_synonym"]
    i = int(hashlib.sha1(f"{seed}:{query_id}".encode()).hexdigest()[:8], 16) % len(candidates)
    return candidates[i], []


def synonym_sets(states_file) -> dict[str, list[str]]:
    """Phrase -> its synonym set (the ``members`` of the first line of ``states_file`` that holds it, canonical text
    first); malformed lines raise `eval.io.FormatError`."""
    from eval.io import FormatError, iter_jsonl

    out: dict[str, list[str]] = {}
    for line, d in iter_jsonl(states_file):
        text, members = d.get("text"), d.get("members") or []
        if not isinstance(text, str) or not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            raise FormatError(states_file, "expected a string 'text' and a list of strings 'members'", line=line,
                              field="members")
        group = list(dict.fromkeys([text, *members]))
        for m in group:
            out.setdefault(m, group)
    return out


def synonym_phrase_records(bench, split: str | None = "test", *, seed: int = 0, fair_only: bool = False,
                           synonyms_file=None) -> list:
    """One `eval.phrases.PhraseRecord` per query of ``split`` (file order): its synonym paraphrase, from the synonym
    sets of ``synonyms_file`` (default: the benchmark's ``states.jsonl``)."""
    from eval.phrases import PhraseRecord

    path = Path(synonyms_file) if synonyms_file else bench.root / "states.jsonl"
    sets = synonym_sets(path)
    ident = {"seed": seed, "benchmark": bench.manifest.name, "version": bench.manifest.version,
             "synonyms_sha": hashlib.sha256(path.read_bytes()).hexdigest()[:16]}
    config_hash = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    sel = bench.queries_ds.select(bench.query_rows(split, fair_only=fair_only))
    out = []
    for qid, target in zip(sel["id"][:], sel["target_state"][:], strict=True):
        phrase, flags = synonym_paraphrase(qid, target, sets.get(target, ()), seed)
        out.append(PhraseRecord(query_id=qid, phrase=phrase, phrases=[phrase], raw=phrase,
                                model=f"synonym-sets:{path}", backend="none", forecaster=SYNONYMS,
                                decoding={"seed": seed}, config_hash=config_hash, flags=flags))
    return out


app = typer.Typer(help="Canonicalization probes that need no model.", no_args_is_help=True, add_completion=False)


@app.command("synonyms")
def synonyms(
    data: Path = typer.Option(..., "--data", help="benchmark directory (states.jsonl members = synonym sets)",
                              callback=data_callback),
    out: Path = typer.Option(..., "--out", help="phrase file to write (JSONL, eval.phrases)"),
    split: str = typer.Option("test", "--split", help="train | val | test | all"),
    seed: int = typer.Option(0, "--seed", help="picks among a state's synonyms (deterministic per query id)"),
    fair_only: bool = typer.Option(False, "--fair-only", help="only queries whose GT is in the corpus"),
    synonyms_file: Path = typer.Option(None, "--synonyms", help="states.jsonl whose members are the synonym sets "
                                                                "(default: the benchmark's own)"),
    overwrite: bool = overwrite_option(),
) -> None:
    """The deterministic paraphrase oracle: each query's true state reworded by a synonym from its synonym set."""
    from eval.benchmark import Benchmark
    from eval.io import write_json, write_jsonl
    from forecasters.cli import check_phrase_out

    check_phrase_out(out, [data, synonyms_file], overwrite, sidecars=("config",))
    bench = Benchmark.load(data)
    recs = synonym_phrase_records(bench, None if split == "all" else split, seed=seed, fair_only=fair_only,
                                  synonyms_file=synonyms_file)
    no_syn = sum("no_synonym" in r.flags for r in recs)
    write_jsonl(out, (r.to_dict() for r in recs))
    write_json(out.with_name(out.name.removesuffix(".jsonl") + ".config.json"),
               {"forecaster": SYNONYMS, "data": str(data), "split": split, "seed": seed, "fair_only": fair_only,
                "synonyms": str(synonyms_file or Path(data) / "states.jsonl"),
                "queries": len(recs), "no_synonym": no_syn, "config_hash": recs[0].config_hash if recs else None})
    typer.echo(f"wrote {out}: {len(recs)} paraphrases ({no_syn} targets without a synonym keep their text)")
