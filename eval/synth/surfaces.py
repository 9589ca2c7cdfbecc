"""The surfaces of the synthetic world: every kind of static or kinematic piece an object can touch or rest on.

One `Surface` holds everything the generator's stages need to know about a piece kind, so a new kind is one
`surface(...)` call (in this module, or in the module of the scene family that uses it):

- the simulator (`eval.synth.scenes`) reads its material and its support code;
- the record (`eval.synth.record`) stores the support code (``support``, ``impact_kind``) and the contact bit
  (``contacts``), `contact_bit` maps one to the other;
- the labeller (`eval.synth.states`) counts an impact on a ``landing`` surface as a landing, and labels an object
  held up by a surface with a ``place`` by that place;
- the describers (`eval.synth.lexicon`) word such a place with the surface's ``words``;
- the renderer (`eval.synth.render`) draws a static piece in its ``look``.

The built-in surfaces' places need geometry (a table's edge, a ramp's halves, a container's inside and rim), so the
labeller decides them with its own rules and they register no ``place``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from eval.synth import record as R

LOOKS = ("furniture", "dim", "inverse")
"""How the renderer colours a static piece: the scene's furniture colour, that colour darkened (walls, gates), or
its complement (containers)."""


@dataclass(frozen=True)
class Surface:
    """One kind of piece: ``kind`` (its name in the record's ``static_kind`` / ``kin_kind``), ``support`` (its
    ``SUPPORT_*`` code), ``contact`` (its ``CONTACT_*`` bit: a category, several surfaces may share one),
    ``friction`` and ``elasticity`` (pymunk multiplies them with the object's), ``landing`` (an impact on it is a
    landing: a bounce may follow), ``place`` (the place of an object it holds up, labelled by the generic rule;
    ``""``: decided by the labeller's own rules or none), ``words`` (lexicon name -> the phrasings of ``place``),
    ``look`` (`LOOKS`) and ``top_line`` (the renderer lights its top edge)."""

    kind: str
    support: int
    contact: int
    friction: float
    elasticity: float
    landing: bool = False
    place: str = ""
    words: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    look: str = "furniture"
    top_line: bool = False


SURFACES: dict[str, Surface] = {}
"""kind -> its `Surface`, in registration order."""


def surface(kind: str, *, contact: int, friction: float, elasticity: float, support: int | None = None,
            landing: bool = False, place: str = "", words: Mapping[str, tuple[str, ...]] | None = None,
            look: str = "furniture", top_line: bool = False) -> Surface:
    """Register a surface kind and return it. ``support``: its code (default: the next free one, above every code
    in use, so a new kind never changes the codes of a record without it). A ``place`` needs ``words`` for every
    lexicon (``corpus`` and ``held-out``)."""
    if kind in SURFACES:
        raise ValueError(f"surface {kind!r} is already registered")
    if look not in LOOKS:
        raise ValueError(f"surface {kind!r}: look {look!r} is not one of {LOOKS}")
    if place and not words:
        raise ValueError(f"surface {kind!r}: place {place!r} needs words for each lexicon")
    code = support if support is not None else max([R.SUPPORT_OBJECT, *(s.support for s in SURFACES.values())]) + 1
    s = Surface(kind, code, contact, friction, elasticity, landing, place, dict(words or {}), look, top_line)
    SURFACES[kind] = s
    return s


def get(kind: str) -> Surface:
    """The registered surface ``kind`` (a clear error naming the known kinds otherwise)."""
    if kind not in SURFACES:
        raise KeyError(f"unknown surface {kind!r}; registered: {sorted(SURFACES)}")
    return SURFACES[kind]


def contact_bit(support: int) -> int:
    """The ``CONTACT_*`` bit of a support code (an object's code included)."""
    if support == R.SUPPORT_OBJECT:
        return R.CONTACT_OBJECT
    for s in SURFACES.values():
        if s.support == support:
            return s.contact
    raise KeyError(f"no surface has support code {support}")


def contact_bits() -> dict[int, int]:
    """Support code -> ``CONTACT_*`` bit, for every registered code and an object's."""
    return {code: contact_bit(code) for code in {s.support for s in SURFACES.values()} | {R.SUPPORT_OBJECT}}


def landing_codes() -> tuple[int, ...]:
    """Support codes an impact on which is a landing: the landing surfaces' and an object's."""
    return tuple(s.support for s in SURFACES.values() if s.landing) + (R.SUPPORT_OBJECT,)


def placed() -> list[Surface]:
    """The surfaces labelled by the generic rule (those with a ``place``), in registration order."""
    return [s for s in SURFACES.values() if s.place]


def place_words(place: str, lexicon: str) -> tuple[str, ...] | None:
    """The phrasings of a surface's ``place`` in the lexicon named ``lexicon`` (None: no surface has that place)."""
    for s in SURFACES.values():
        if s.place == place:
            if lexicon not in s.words:
                raise KeyError(f"surface {s.kind!r} has no words for place {place!r} in lexicon {lexicon!r}")
            return s.words[lexicon]
    return None


# Built-in surfaces (materials: friction, elasticity).
surface("floor", support=R.SUPPORT_FLOOR, contact=R.CONTACT_FLOOR, friction=0.8, elasticity=0.5, landing=True)
surface("wall", support=R.SUPPORT_WALL, contact=R.CONTACT_WALL, friction=0.5, elasticity=0.6, look="dim")
surface("table", support=R.SUPPORT_TABLE, contact=R.CONTACT_TABLE, friction=0.6, elasticity=0.3, landing=True,
        top_line=True)
surface("leg", support=R.SUPPORT_TABLE, contact=R.CONTACT_TABLE, friction=0.5, elasticity=0.3)
surface("ramp", support=R.SUPPORT_RAMP, contact=R.CONTACT_RAMP, friction=0.5, elasticity=0.2, landing=True,
        top_line=True)
surface("gate", support=R.SUPPORT_GATE, contact=R.CONTACT_GATE, friction=0.5, elasticity=0.1, look="dim")
surface("container", support=R.SUPPORT_CONTAINER, contact=R.CONTACT_CONTAINER, friction=0.7, elasticity=0.4,
        landing=True, look="inverse")
surface("pusher", support=R.SUPPORT_PUSHER, contact=R.CONTACT_PUSHER, friction=0.8, elasticity=0.0)
surface("shelf", support=R.SUPPORT_SHELF, contact=R.CONTACT_TABLE, friction=0.35, elasticity=0.2, landing=True)
