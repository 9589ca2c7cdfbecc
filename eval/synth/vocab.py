"""The synthetic benchmark's vocabulary: subjects (palette x shape), canonical states and their synonyms,
and the hand-written state-similarity map that stands in for BGE neighbours.

Canonical states are predicate-level (type2, e.g. ``falling``); a subject + predicate state (type1) is
``f"{subject} {state}"`` (``red ball falling``). Every canonical state lists 3-6 synonymous raw phrasings,
the first being the canonical text itself; a segment's ``raw`` description draws one of them (seeded),
which mimics the lexically noisy free-form descriptions that the paper canonicalizes.

Nothing here depends on the simulator: `eval.synth.states` decides *which* state an object is in,
this module only names it.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Object colours: name -> sRGB under neutral light (a family's light tint is applied when rendering).
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (214, 48, 44),
    "blue": (40, 96, 214),
    "green": (52, 160, 66),
    "yellow": (232, 196, 36),
    "purple": (136, 72, 186),
    "orange": (238, 124, 28),
}

#: Object shapes: name -> (width, height) ranges in world units (a ball uses width as its diameter).
SHAPES: dict[str, tuple[tuple[float, float], tuple[float, float]]] = {
    "ball": ((20.0, 28.0), (20.0, 28.0)),
    "box": ((22.0, 28.0), (22.0, 28.0)),
    "block": ((34.0, 42.0), (14.0, 18.0)),
    "domino": ((9.0, 11.0), (40.0, 48.0)),
}

#: Shapes whose orientation carries state (tipping over, lying on its side, leaning).
ELONGATED_SHAPES = ("block", "domino")


def subject_name(color: str, shape: str) -> str:
    """The shared subject vocabulary: ``"red ball"``, ``"blue box"``, ..."""
    return f"{color} {shape}"


@dataclass(frozen=True)
class CanonicalState:
    """A canonical type2 state: a stable ``id`` (slug), its ``text`` and its raw ``synonyms`` (text first)."""

    id: str
    text: str
    synonyms: tuple[str, ...]


def _state(text: str, *others: str) -> CanonicalState:
    return CanonicalState(text.replace(" ", "_"), text, (text, *others))


#: Every canonical state, in a fixed order (the order of ``states.jsonl``).
STATES: tuple[CanonicalState, ...] = (
    # --- at rest ---
    _state("resting on the table", "sitting on the table", "lying still on the tabletop", "at rest on the table"),
    _state("resting on the floor", "sitting on the floor", "lying still on the ground", "at rest on the floor",
           "settled on the ground"),
    _state("resting on the ramp", "sitting at the top of the ramp", "held still on the slope", "waiting on the ramp"),
    _state("resting inside the container", "sitting in the bin", "settled inside the box", "lying in the container"),
    _state("stacked on another object", "sitting on top of another object", "piled on another object",
           "resting on top of something"),
    _state("standing upright", "standing on end", "standing up straight", "upright and still"),
    _state("lying on its side", "lying flat", "knocked flat", "toppled and lying down", "fallen over"),
    _state("resting against the wall", "pressed against the wall", "stopped at the wall", "sitting by the wall"),
    _state("resting against another object", "touching another object at rest", "nestled against another object",
           "sitting next to another object"),
    _state("leaning on another object", "propped against another object", "leaning against a neighbour",
           "resting at an angle on another object"),
    _state("hanging in the air", "held above the scene", "suspended in the air", "dangling from the gripper"),
    _state("wobbling", "rocking in place", "teetering", "swaying back and forth"),
    # --- airborne ---
    _state("falling", "dropping", "plummeting", "falling down", "dropping straight down"),
    _state("spinning through the air", "tumbling through the air", "flipping in mid-air", "twirling as it falls"),
    _state("flying through the air", "sailing through the air", "launched into the air", "airborne and moving fast"),
    _state("bouncing", "bouncing up", "rebounding", "hopping off the ground", "springing back up"),
    _state("dropping into the container", "falling into the bin", "dropping into the box", "landing in the container"),
    # --- moving on a surface ---
    _state("rolling down the ramp", "rolling down the slope", "rolling downhill", "speeding down the ramp"),
    _state("sliding down the ramp", "sliding down the slope", "slipping down the incline", "gliding downhill"),
    _state("rolling across the table", "rolling along the tabletop", "rolling over the table", "rolling on the table"),
    _state("sliding across the table", "sliding along the tabletop", "skidding across the table",
           "gliding over the table"),
    _state("rolling on the floor", "rolling along the ground", "rolling across the floor", "rolling away"),
    _state("sliding on the floor", "sliding along the ground", "skidding across the floor", "scooting along the floor"),
    _state("slowing down", "coming to a stop", "losing speed", "decelerating", "rolling to a halt"),
    _state("going over the edge", "tipping over the edge", "reaching the edge", "sliding off the edge",
           "about to fall off the edge"),
    _state("moving around inside the container", "rattling around in the bin", "shifting inside the box",
           "settling into the container"),
    _state("sliding off another object", "slipping off another object", "sliding down another object"),
    # --- interactions ---
    _state("being pushed", "pushed along", "shoved forward", "being shoved", "driven by the pusher"),
    _state("crashing into another object", "hitting another object", "smashing into something",
           "ramming another object", "knocking into another object"),
    _state("being hit by another object", "getting struck", "being bumped by another object",
           "getting knocked by something", "taking a hit"),
    _state("bouncing off the wall", "hitting the wall", "rebounding off the wall", "glancing off the side"),
    _state("tipping over", "toppling over", "falling over", "keeling over", "tilting over"),
)

STATE_BY_TEXT: dict[str, CanonicalState] = {s.text: s for s in STATES}
STATE_BY_ID: dict[str, CanonicalState] = {s.id: s for s in STATES}

#: Hand-written state similarity (the stand-in for BGE neighbours at cosine >= 0.85 in the paper): states a
#: reasonable phrase embedding would put close, because they share a predicate ("rolling ...", "resting ..."),
#: a motion regime (airborne, at rest) or a typical confusion. The map is symmetrised by `neighbours`.
_SIMILAR: dict[str, tuple[str, ...]] = {
    "resting on the table": ("resting on the floor", "resting on the ramp", "stacked on another object"),
    "resting on the floor": ("resting inside the container", "lying on its side", "standing upright",
                             "resting against the wall", "resting against another object"),
    "resting against another object": ("leaning on another object", "stacked on another object"),
    "resting on the ramp": ("resting on the floor",),
    "resting inside the container": ("stacked on another object", "moving around inside the container"),
    "stacked on another object": ("leaning on another object",),
    "standing upright": ("wobbling",),
    "lying on its side": ("leaning on another object", "tipping over"),
    "hanging in the air": ("falling",),
    "wobbling": ("tipping over",),
    "falling": ("flying through the air", "dropping into the container", "bouncing", "going over the edge",
                "spinning through the air"),
    "spinning through the air": ("flying through the air", "tipping over"),
    "flying through the air": ("bouncing",),
    "bouncing": ("bouncing off the wall",),
    "rolling down the ramp": ("sliding down the ramp", "rolling across the table", "rolling on the floor"),
    "sliding down the ramp": ("sliding across the table", "sliding on the floor"),
    "rolling across the table": ("sliding across the table", "rolling on the floor"),
    "sliding across the table": ("sliding on the floor", "being pushed"),
    "rolling on the floor": ("sliding on the floor", "slowing down"),
    "sliding on the floor": ("slowing down",),
    "moving around inside the container": ("sliding off another object",),
    "sliding off another object": ("falling",),
    "crashing into another object": ("being hit by another object", "bouncing off the wall", "being pushed"),
    "being hit by another object": ("being pushed",),
    "tipping over": ("going over the edge",),
}


def neighbours(state_text: str) -> tuple[str, ...]:
    """Declared similar states of ``state_text`` (symmetric, never the state itself), in `STATES` order."""
    near = set(_SIMILAR.get(state_text, ()))
    near |= {a for a, bs in _SIMILAR.items() if state_text in bs}
    near.discard(state_text)
    return tuple(s.text for s in STATES if s.text in near)


def validate_vocab() -> None:
    """Internal consistency: unique ids/texts/synonyms, 3-6 synonyms each, similarity map names known states."""
    texts = [s.text for s in STATES]
    if len(set(texts)) != len(texts) or len({s.id for s in STATES}) != len(STATES):
        raise ValueError("duplicate canonical state")
    seen: set[str] = set()
    for s in STATES:
        if not 3 <= len(s.synonyms) <= 6:
            raise ValueError(f"{s.text!r} has {len(s.synonyms)} synonyms (need 3-6)")
        if seen & set(s.synonyms):
            raise ValueError(f"{s.text!r} shares a synonym with another state: {sorted(seen & set(s.synonyms))}")
        seen |= set(s.synonyms)
    for a, bs in _SIMILAR.items():
        for b in (a, *bs):
            if b not in STATE_BY_TEXT:
                raise ValueError(f"similarity map names unknown state {b!r}")
