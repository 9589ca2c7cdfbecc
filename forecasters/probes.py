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

Without a model (``python -m forecasters probes synonyms``): a deterministic paraphrase oracle, from one of two
phrasing sources (``--phrasing``):

- ``held-out`` (the default where the benchmark has ``sim/phrases.jsonl``, i.e. the synthetic benchmark): the target
  text's denotation (the attribute values it says) re-said in the held-out lexicon (`eval.synth.paraphrase`), which
  never wrote the corpus -- the non-circular paraphrase oracle;
- ``members``: exact synonym sets, the ``members`` of a ``states.jsonl`` (by default the benchmark's own). On a
  benchmark canonicalized from its own raw corpus these are the very phrasings that wrote the corpus, so this
  source measures only the clustering, not paraphrase robustness.

With ``members``, for query ``q`` with target text ``t``, the candidates are the other phrasings of the synonym set holding ``t`` (file
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
from eval.errors import InputError
from forecasters.spec import ForecasterSpec, PromptInput

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
        raise InputError(f"query {query.id}: its in-video GT tier is empty, so there is no true target segment "
                         "to describe")
    same_object = [s for s in own if s.object_id == query.object_id]
    exact = [s for s in same_object if s.start == query.target_time]
    return (exact or sorted(same_object, key=lambda s: s.start) or sorted(own, key=lambda s: s.start))[0]


def describe_inputs(query, bench) -> PromptInput:
    """The description probe's input: the object's name and the middle frame of its true target segment."""
    seg = target_segment(query, bench)
    return PromptInput(values={"subject": query.subject}, media={"frame": (seg.frame,)})


PROBES = (
    ForecasterSpec(name=PARAPHRASE, prompt="paraphrase", build=paraphrase_inputs, default_model="text-only", media=(),
                   description="paraphrase oracle: an LLM rewords the query's true target state (App. U)"),
    ForecasterSpec(name=DESCRIBE, prompt="frame_description", build=describe_inputs, default_model="llava",
                   media=("frame",),
                   description="cross-model description: a VLM describes the true target segment's frame (App. U)"),
)


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


def default_phrasing(bench) -> str:
    """``held-out`` where the benchmark records its phrases' denotations (``sim/phrases.jsonl``), else ``members``."""
    return "held-out" if (bench.root / "sim" / "phrases.jsonl").exists() else "members"


def held_out_phrase_records(bench, split: str | None = "test", *, seed: int = 0, fair_only: bool = False) -> list:
    """One `eval.phrases.PhraseRecord` per query of ``split``: its target text re-said in the held-out lexicon."""
    from eval.phrases import PhraseRecord
    from eval.synth.build import read_denotations
    from eval.synth.paraphrase import paraphrase_for

    den = read_denotations(bench.root)
    ident = {"seed": seed, "benchmark": bench.manifest.name, "version": bench.manifest.version, "phrasing": "held-out"}
    config_hash = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    sel = bench.queries_ds.select(bench.query_rows(split, fair_only=fair_only))
    out = []
    for qid, target in zip(sel["id"][:], sel["target_state"][:], strict=True):
        d = den.get(target)
        phrase, flags = (paraphrase_for(qid, d, seed), []) if d else (target, ["no_denotation"])
        out.append(PhraseRecord(query_id=qid, phrase=phrase, phrases=[phrase], raw=phrase, model="held-out-lexicon",
                                backend="none", forecaster=SYNONYMS, decoding={"seed": seed},
                                config_hash=config_hash, flags=flags))
    return out


def synonym_phrase_records(bench, split: str | None = "test", *, seed: int = 0, fair_only: bool = False,
                           synonyms_file=None, phrasing: str | None = None) -> list:
    """One `eval.phrases.PhraseRecord` per query of ``split`` (file order): its paraphrase from ``phrasing``
    (``held-out`` or ``members``; default `default_phrasing`); ``members`` reads the synonym sets of
    ``synonyms_file`` (default: the benchmark's ``states.jsonl``)."""
    from eval.phrases import PhraseRecord

    phrasing = phrasing or default_phrasing(bench)
    if phrasing == "held-out":
        return held_out_phrase_records(bench, split, seed=seed, fair_only=fair_only)
    if phrasing != "members":
        raise InputError(f"unknown phrasing {phrasing!r}; expected 'held-out' or 'members'")
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
    phrasing: str = typer.Option(None, "--phrasing", help="held-out (default where the benchmark has "
                                                          "sim/phrases.jsonl) or members (synonym sets; the "
                                                          "default with --synonyms)"),
    overwrite: bool = overwrite_option(),
) -> None:
    """The deterministic paraphrase oracle: each query's true state reworded (held-out lexicon or synonym sets)."""
    from eval.benchmark import Benchmark
    from eval.io import write_json, write_jsonl
    from forecasters.phrasefile import check_phrase_out

    check_phrase_out(out, [data, synonyms_file], overwrite, sidecars=("config",))
    bench = Benchmark.load(data)
    if synonyms_file is not None and phrasing == "held-out":
        raise typer.BadParameter("--synonyms gives synonym sets, which only --phrasing members reads",
                                 param_hint="--synonyms")
    phrasing = phrasing or ("members" if synonyms_file is not None else default_phrasing(bench))
    recs = synonym_phrase_records(bench, None if split == "all" else split, seed=seed, fair_only=fair_only,
                                  synonyms_file=synonyms_file, phrasing=phrasing)
    no_syn = sum(bool({"no_synonym", "no_denotation"} & set(r.flags)) for r in recs)
    write_jsonl(out, (r.to_dict() for r in recs))
    write_json(out.with_name(out.name.removesuffix(".jsonl") + ".config.json"),
               {"forecaster": SYNONYMS, "data": str(data), "split": split, "seed": seed, "fair_only": fair_only,
                "phrasing": phrasing,
                "synonyms": str(synonyms_file or Path(data) / "states.jsonl"),
                "queries": len(recs), "no_synonym": no_syn, "config_hash": recs[0].config_hash if recs else None})
    typer.echo(f"wrote {out}: {len(recs)} paraphrases ({phrasing}; {no_syn} targets without a paraphrase keep their "
               "text)")
