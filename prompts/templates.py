"""Prompt templates: text files with named placeholders, a stable id, and a content hash.

A template file (``prompts/templates/<id>.txt``) is a header of ``# `` comment lines, a line ``---``, then the body::

    # M3, the multimodal-LLM baseline ...
    # verbatim: ../shared/papers/001, "M3 (multimodal-LLM baseline)."
    # paper-placeholders: frames = [8 prefix frames]
    ---
    {frames} {question} Answer with ONLY the object’s predicted future state as a short phrase (2–5 words), no explanation.

- The id is the file stem; the hash is ``sha256(body as UTF-8)`` (first 16 hex digits). The header is documentation
  and does not enter the hash; the body's final newline is not part of the body.
- ``# key: value`` header lines are parsed into `Template.meta`; ``verbatim:`` marks a prompt copied character for
  character from a paper (``tests/prompts`` checks it against the paper text).
- A verbatim prompt is the paper's text as its reader sees it, not its LaTeX source: the paper files hold the source
  (``2--5``), typeset as an en dash (``2–5``), and the model is sent ``2–5``, what the authors' printed prompt shows.
  `paper_text` renders a source line (``---`` -> em dash, ``--`` -> en dash, simple inline math ``$k$`` -> ``k``);
  the test compares each verbatim template with the rendered paper line character for character. Our own
  templates write ranges with the en dash too.
- Placeholders are ``{name}`` with ``name`` an identifier; ``{{`` and ``}}`` are literal braces; any other brace is
  an error when the template loads.
- Rendering fails loudly (`PromptError`) on a missing value, on a value for a placeholder the template does not
  have, and on a non-string value. Media placeholders (frames, a video) render to `MediaSlot` parts.

Depends on nothing of the toolkit.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

HEADER_END = "---"
HASH_LEN = 16
_TOKEN = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}|[{}]")


class PromptError(ValueError):
    """A template that cannot be loaded or rendered; the message names the template (id and file)."""

    #: A user error: the commands report it as one line and exit 2 (`eval.errors.EXIT_USER_ERROR`; prompts imports
    #: nothing of the toolkit).
    exit_code = 2


@dataclass(frozen=True)
class MediaSlot:
    """Where media (images or a video) go in a rendered prompt; ``name`` is the placeholder's name."""

    name: str


@dataclass(frozen=True)
class Template:
    """One prompt template. ``body`` is the exact text with ``{placeholders}``; ``placeholders`` in order of
    first appearance."""

    id: str
    body: str
    path: str = ""
    meta: Mapping[str, str] = field(default_factory=dict)

    @functools.cached_property
    def _tokens(self) -> list[tuple[str, str]]:
        """The body as ``[("text", s) | ("ph", name)]``; raises `PromptError` on a stray brace."""
        out: list[tuple[str, str]] = []
        pos = 0
        for m in _TOKEN.finditer(self.body):
            if m.start() > pos:
                out.append(("text", self.body[pos:m.start()]))
            tok = m.group(0)
            if tok in ("{{", "}}"):
                out.append(("text", tok[0]))
            elif m.group(1):
                out.append(("ph", m.group(1)))
            else:
                line = self.body.count("\n", 0, m.start()) + 1
                raise PromptError(f"template {self.id!r} ({self.path or 'inline'}): stray {tok!r} in body line {line} "
                                  "(placeholders are {name}; write {{ or }} for a literal brace)")
            pos = m.end()
        if pos < len(self.body):
            out.append(("text", self.body[pos:]))
        return out

    @functools.cached_property
    def placeholders(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for kind, v in self._tokens:
            if kind == "ph":
                seen.setdefault(v, None)
        return tuple(seen)

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.body.encode("utf-8")).hexdigest()[:HASH_LEN]

    @property
    def verbatim(self) -> bool:
        """True when the body is copied verbatim from a paper (header ``verbatim:``)."""
        return "verbatim" in self.meta

    def _check(self, values: Mapping[str, object], media: Collection[str]) -> None:
        names = set(self.placeholders)
        unknown_media = sorted(set(media) - names)
        given = set(values) | set(media)
        missing = sorted(names - given)
        unknown = sorted(set(values) - names)
        both = sorted(set(values) & set(media))
        problems = []
        if missing:
            problems.append(f"missing value(s) for {missing}")
        if unknown or unknown_media:
            problems.append(f"unknown placeholder(s) {unknown + unknown_media} (the template has {sorted(names)})")
        if both:
            problems.append(f"{both} given both as text and as media")
        bad = sorted(k for k, v in values.items() if not isinstance(v, str))
        if bad:
            problems.append(f"value(s) for {bad} are not strings")
        if problems:
            raise PromptError(f"template {self.id!r} ({self.path or 'inline'}): " + "; ".join(problems))

    def render(self, **values: str) -> str:
        """The body with every placeholder replaced by its (string) value. Media placeholders are not allowed here."""
        self._check(values, ())
        return "".join(v if kind == "text" else values[v] for kind, v in self._tokens)

    def render_parts(self, values: Mapping[str, str], media: Collection[str] = ()) -> tuple[str | MediaSlot, ...]:
        """Render to a sequence of text parts and `MediaSlot` parts (one per media placeholder occurrence).

        Whitespace touching a media slot is dropped, and empty text parts are omitted, so
        ``"{frames} {question} Answer ..."`` renders to ``(MediaSlot("frames"), "What ... Answer ...")``.
        """
        self._check(values, media)
        parts: list[str | MediaSlot] = []
        buf: list[str] = []

        def flush(strip_right: bool) -> None:
            text = "".join(buf)
            buf.clear()
            if parts and isinstance(parts[-1], MediaSlot):
                text = text.lstrip()
            if strip_right:
                text = text.rstrip()
            if text:
                parts.append(text)

        for kind, v in self._tokens:
            if kind == "ph" and v in media:
                flush(strip_right=True)
                parts.append(MediaSlot(v))
            else:
                buf.append(v if kind == "text" else values[v])
        flush(strip_right=False)
        return tuple(parts)


_INLINE_MATH = re.compile(r"\$([A-Za-z0-9<>=+]+)\$")


def paper_text(latex: str) -> str:
    """A line of a paper's LaTeX source as its reader sees it: ``---`` -> "—" (em dash), ``--`` -> "–" (en dash),
    inline math of letters, digits and ``<>=+`` -> its content (``after-$k$s`` -> ``after-ks``). Nothing else
    changes (the paper files already hold Unicode quotes and symbols)."""
    text = latex.replace("---", "\u2014").replace("--", "\u2013")
    return _INLINE_MATH.sub(r"\1", text)


def parse_template(text: str, *, id: str, path: str = "") -> Template:
    """Parse a template file's text (header, ``---``, body) into a `Template`."""
    lines = text.split("\n")
    meta: dict[str, str] = {}
    for i, line in enumerate(lines):
        if line == HEADER_END:
            body = "\n".join(lines[i + 1:])
            body = body[:-1] if body.endswith("\n") else body
            if not body.strip():
                raise PromptError(f"template {id!r} ({path or 'inline'}): empty body")
            t = Template(id=id, body=body, path=path, meta=meta)
            t.placeholders  # noqa: B018 - validate the braces now, not at first render
            return t
        if not line.strip():
            continue
        if not line.startswith("#"):
            raise PromptError(f"template {id!r} ({path or 'inline'}) line {i + 1}: header lines start with '#' and "
                              f"end with a line '{HEADER_END}'; got {line[:60]!r}")
        key, sep, value = line.lstrip("#").strip().partition(":")
        if sep and re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", key.strip()):
            meta[key.strip()] = value.strip()
    raise PromptError(f"template {id!r} ({path or 'inline'}): no '{HEADER_END}' line separating header and body")


def load_file(path: str | os.PathLike) -> Template:
    """Load a template file from any path (its id is the file stem)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise PromptError(f"template file {path} does not exist") from None
    try:  # prompts depends on nothing: eval.io.read_text's rule, restated (strict UTF-8, the line named)
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise PromptError(f"template file {path}:{line}: not valid UTF-8 (byte 0x{raw[e.start]:02x}: {e.reason})"
                          ) from None
    return parse_template(text, id=path.stem, path=str(path))


def _templates_root():
    return resources.files("prompts").joinpath("templates")


def list_templates() -> list[str]:
    """Ids of the templates shipped in ``prompts/templates/``."""
    return sorted(p.name[:-4] for p in _templates_root().iterdir() if p.name.endswith(".txt"))


@functools.cache
def load(id_or_path: str) -> Template:
    """A shipped template by id (``"m3"``), or a template file by path (anything ending in ``.txt``)."""
    if id_or_path.endswith(".txt") or os.sep in id_or_path:
        return load_file(id_or_path)
    res = _templates_root().joinpath(f"{id_or_path}.txt")
    if not res.is_file():
        raise PromptError(f"unknown prompt template {id_or_path!r}; shipped: {list_templates()} "
                          "(or pass a path to a .txt template file)")
    return parse_template(res.read_text(encoding="utf-8"), id=id_or_path, path=str(res))


def _fmt_seconds(t: float) -> str:
    s = f"{float(t):.2f}".rstrip("0").rstrip(".")
    return "0" if s in ("", "-0") else s


def _entry(e) -> tuple[float, str]:
    if isinstance(e, Mapping):
        return float(e["t"]), str(e["state"])
    if isinstance(e, tuple | list):
        return float(e[0]), str(e[1])
    return float(e.t), str(e.state)


def transcript_before(entries: Iterable, target_time: float) -> list[tuple[float, str]]:
    """The transcript entries with ``t < target_time`` (strictly), sorted by time: the paper's truncation, so the
    answer is never revealed. Entries are ``(t, state)`` pairs, ``{"t", "state"}`` dicts or objects with
    ``.t``/``.state``; times are seconds from the video start."""
    cut = float(target_time)
    return sorted((p for p in map(_entry, entries) if p[0] < cut), key=lambda p: p[0])


def format_transcript(entries: Iterable, target_time: float) -> str:
    """The text-only prompt's transcript: ``"{t}s: {state}"`` for each entry strictly before ``target_time``,
    joined by ``"; "`` (e.g. ``"0s: resting on the table; 0.5s: rolling down the ramp"``). Times print with at
    most two decimals, trailing zeros dropped."""
    return "; ".join(f"{_fmt_seconds(t)}s: {s}" for t, s in transcript_before(entries, target_time))
