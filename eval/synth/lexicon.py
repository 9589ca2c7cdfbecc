"""Objects and words of the synthetic world: subjects, the compositional true state, and two describers.

**Objects.** A subject is ``"[size] colour shape"`` (``"small red ball"``, ``"teal brick"``): `COLORS` x `SHAPES` x an
optional size word (`size_word`: the lower / upper third of the shape's size range reads ``small`` / ``large``).
Subjects recur across videos and domains (the type1 GT); within a video every object has its own colour.

**The true state** (`TrueState`) composes what the simulator knows about one object over one segment
(`eval.synth.states` decides the values; every threshold is documented there):

=============  ==========================================================================================
attribute      values
=============  ==========================================================================================
``motion``     `MOTIONS`: at rest, rolling, sliding, tumbling, falling, flying, bouncing, spinning, wobbling,
               toppling, being pushed, hanging (from the gripper), crashing (into ``other``), being hit (by
               ``other``)
``place``      `PLACES`: floor, table (middle), table edge, ramp upper / lower half, inside the container, on
               the container's rim, shelf, on top of ``other``, against the wall, over the container, in the air;
               and the place of any registered surface that has one (`eval.synth.surfaces`)
``relation``   `RELATIONS`: touching, leaning against, next to, under -- with ``other``; or none (objects at rest,
               wobbling or toppling only: what a moving object passes is not part of its state)
``other``      the *kind* (shape) of the other object of ``relation`` (or of ``crashing`` / ``being hit`` /
               ``on top of``) -- never its size or colour, so a state is shared across videos
``pose``       `POSES`: upright, on its side, upside down, tilted (shapes with a marked top only; else none)
=============  ==========================================================================================

A state's stable id is `TrueState.key` (``"at_rest|floor|next_to|ball|upright"``), stored per segment as
``sim_state``; `reference_text` renders it completely with the first word of every slot (the sim-truth benchmark's
state text).

**Describers.** `describe` turns a true state into a free-form phrase, the way an annotator would: it picks words
from a lexicon (several surface forms per value), one of several word orders, optional determiners, and it may
leave out qualifiers (`OMIT`: pose, relation, place are each dropped with a probability).
It returns the phrase and its *denotation*: the attribute values the phrase actually mentions (`Denotation`); a
segment *satisfies* a phrase when its true state agrees with every mentioned value (`satisfies`), which is how the
verification emulation of `retrieval.canon.apply` judges a GT candidate.

Two lexicons: `CORPUS` writes every corpus description (``raw``) and question; `HELD_OUT` uses other words and other
grammar (nominal and participle constructions, other shape nouns) and is never used to write the benchmark: it is the
paraphrase distribution of the canonicalization probes (`eval.synth.paraphrase`), so those probes are not circular.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from eval.errors import InputError
from eval.synth import surfaces

#: Object colours: name -> sRGB under neutral light.
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (214, 48, 44), "blue": (40, 96, 214), "green": (52, 160, 66), "yellow": (232, 196, 36),
    "purple": (136, 72, 186), "orange": (238, 124, 28), "pink": (236, 120, 170), "teal": (28, 150, 150),
    "brown": (128, 84, 44), "gray": (128, 128, 132), "white": (236, 236, 230), "black": (36, 36, 40),
}

#: Shapes: name -> (width range, height range) in world units (a round shape uses the width as its diameter).
SHAPES: dict[str, tuple[tuple[float, float], tuple[float, float]]] = {
    "ball": ((16.0, 30.0), (16.0, 30.0)),
    "wheel": ((22.0, 34.0), (22.0, 34.0)),
    "cube": ((18.0, 28.0), (18.0, 28.0)),
    "brick": ((30.0, 42.0), (13.0, 18.0)),
    "domino": ((8.0, 11.0), (36.0, 48.0)),
    "plank": ((50.0, 70.0), (6.0, 9.0)),
    "wedge": ((24.0, 34.0), (16.0, 24.0)),
    "can": ((15.0, 20.0), (24.0, 32.0)),
}
ROUND_SHAPES = ("ball", "wheel")
"""Shapes simulated as circles: they roll, and have no pose."""
ELONGATED_SHAPES = ("brick", "domino", "plank", "can")
"""Shapes that topple and lean."""


def size_word(shape: str, width: float) -> str:
    """``small`` / ``large`` for the lower / upper third of the shape's width range, else ``""``."""
    (w0, w1), _ = SHAPES[shape]
    u = (width - w0) / (w1 - w0)
    return "small" if u < 1 / 3 else "large" if u > 2 / 3 else ""


def subject_name(color: str, shape: str, size: str = "") -> str:
    """``"small red ball"``, ``"blue cube"``."""
    return " ".join(w for w in (size, color, shape) if w)


MOTIONS = ("at_rest", "rolling", "sliding", "tumbling", "falling", "flying", "bouncing", "spinning", "wobbling",
           "toppling", "pushed", "hanging", "crashing", "hit")
PLACES = ("floor", "floor_table", "floor_ramp", "floor_container", "floor_shelf", "table", "table_edge", "ramp_upper", "ramp_lower", "container", "rim", "shelf", "on_object",
          "wall", "over_container", "air")
RELATIONS = ("touching", "leaning", "next_to", "under")
POSES = ("upright", "side", "upside_down", "tilted")
#: Motions whose ``other`` is part of the motion itself (crashing into X, being hit by X).
EVENT_MOTIONS = ("crashing", "hit")
MOVING_MOTIONS = ("rolling", "sliding", "tumbling", "falling", "flying", "bouncing", "pushed")
AIRBORNE_MOTIONS = ("falling", "flying", "bouncing", "spinning")


@dataclass(frozen=True)
class TrueState:
    """The simulator's state of one object over one segment (see the module docstring)."""

    motion: str
    place: str = ""
    relation: str = ""
    other: str = ""
    pose: str = ""

    @property
    def key(self) -> str:
        """Stable id: the five slots joined by ``|`` (empty slots stay empty)."""
        return "|".join((self.motion, self.place, self.relation, self.other, self.pose))

    @staticmethod
    def is_key(text: object) -> bool:
        """``text`` has the shape of a `key` (five ``|``-separated slots)."""
        return isinstance(text, str) and text.count("|") == len(fields(TrueState)) - 1

    @classmethod
    def from_key(cls, key: str) -> TrueState:
        parts = key.split("|")
        if len(parts) != len(fields(cls)):
            raise InputError(f"not a true-state key: {key!r}")
        return cls(*parts)


Denotation = dict[str, str]
"""The attribute values a phrase mentions: a subset of ``{"motion", "place", "relation", "other", "pose"}`` ->
value."""


PLACE_PARENT = {"floor_table": "floor", "floor_ramp": "floor", "floor_container": "floor", "floor_shelf": "floor",
                "wall": "floor", "table_edge": "table"}
"""A place and the more general place it is part of: "on the floor" is true of an object on the floor by the table."""


def satisfies(state: TrueState, denotation: Denotation) -> bool:
    """True when ``state`` agrees with every value the phrase mentions (``place``: the place or a part of it,
    `PLACE_PARENT`)."""
    for k, v in denotation.items():
        if k == "place":
            if state.place != v and PLACE_PARENT.get(state.place) != v:
                return False
        elif getattr(state, k) != v:
            return False
    return True


# --------------------------------------------------------------------------------------------------------------
# Lexicons. Each slot maps a value to surface forms; ``{o}`` is the other object's noun phrase.


@dataclass(frozen=True)
class Lexicon:
    """Words and word orders of one describer."""

    name: str
    motion: dict[str, tuple[str, ...]]
    place: dict[str, tuple[str, ...]]
    relation: dict[str, tuple[str, ...]]
    pose: dict[str, tuple[str, ...]]
    shape_nouns: dict[str, tuple[str, ...]]
    #: word orders over the slot names M (motion), P (place), R (relation), O (pose)
    orders: tuple[tuple[str, ...], ...]
    determiners: tuple[str, ...] = ("the",)
    omit: dict[str, float] = field(default_factory=dict)
    #: surface forms and word orders are drawn with probability proportional to rank ** -form_zipf (0: uniform):
    #: a describer has favourite words, as one generator model does
    form_zipf: float = 0.0

    def place_forms(self, place: str) -> tuple[str, ...]:
        """The phrasings of ``place``: this lexicon's own, or those of the registered surface that has that place
        (`eval.synth.surfaces`)."""
        forms = self.place.get(place) or surfaces.place_words(place, self.name)
        if forms is None:
            raise KeyError(f"lexicon {self.name!r} has no words for place {place!r}")
        return forms


CORPUS = Lexicon(
    name="corpus",
    motion={
        "at_rest": ("resting", "sitting still", "lying still", "at rest", "motionless"),
        "rolling": ("rolling", "rolling along", "trundling"),
        "sliding": ("sliding", "gliding", "skidding"),
        "tumbling": ("tumbling", "tumbling over and over", "somersaulting"),
        "falling": ("falling", "dropping", "plunging"),
        "flying": ("flying", "sailing", "soaring"),
        "bouncing": ("bouncing", "rebounding", "hopping"),
        "spinning": ("spinning", "twirling", "whirling"),
        "wobbling": ("wobbling", "rocking", "teetering"),
        "toppling": ("toppling over", "tipping over", "keeling over"),
        "pushed": ("being pushed", "being shoved", "pushed along"),
        "hanging": ("hanging from the gripper", "dangling from the claw", "held up by the gripper"),
        "crashing": ("crashing into {o}", "smashing into {o}", "slamming into {o}"),
        "hit": ("being hit by {o}", "getting struck by {o}", "knocked by {o}"),
    },
    place={
        "floor": ("on the floor", "on the ground"),
        "floor_table": ("on the floor beside the table", "on the ground by the table"),
        "floor_ramp": ("on the floor beyond the ramp", "on the ground near the ramp"),
        "floor_container": ("on the floor next to the container", "on the ground beside the bin"),
        "floor_shelf": ("on the floor under the shelf", "on the ground under the ledge"),
        "table": ("on the table", "on the tabletop"),
        "table_edge": ("at the edge of the table", "at the table's edge", "near the edge of the table"),
        "ramp_upper": ("on the upper half of the ramp", "near the top of the ramp", "high on the ramp"),
        "ramp_lower": ("on the lower half of the ramp", "near the bottom of the ramp", "low on the ramp"),
        "container": ("inside the container", "in the bin", "inside the box"),
        "rim": ("on the rim of the container", "on the edge of the bin"),
        "shelf": ("on the shelf", "on the ledge"),
        "on_object": ("on top of {o}", "atop {o}", "stacked on {o}"),
        "wall": ("against the wall", "by the wall"),
        "over_container": ("over the container", "above the bin"),
        "air": ("through the air", "in mid-air"),
    },
    relation={
        "touching": ("touching {o}", "in contact with {o}"),
        "leaning": ("leaning against {o}", "propped against {o}"),
        "next_to": ("next to {o}", "beside {o}", "near {o}"),
        "under": ("under {o}", "beneath {o}", "underneath {o}"),
    },
    pose={
        "upright": ("upright", "standing up"),
        "side": ("on its side", "lying flat"),
        "upside_down": ("upside down", "flipped over"),
        "tilted": ("at an angle", "tilted"),
    },
    shape_nouns={"ball": ("ball",), "wheel": ("wheel",), "cube": ("cube",), "brick": ("brick",),
                 "domino": ("domino",), "plank": ("plank",), "wedge": ("wedge",), "can": ("can",)},
    orders=(("M", "P", "R", "O"), ("M", "O", "P", "R"), ("O", "M", "P", "R"), ("M", "R", "P", "O")),
    determiners=("the", "the", "a"),
    omit={"pose": 0.06, "relation": 0.05, "place": 0.02},
    form_zipf=1.0,
)

HELD_OUT = Lexicon(
    name="held-out",
    motion={
        "at_rest": ("coming to a standstill", "not moving at all", "stationary"),
        "rolling": ("in a roll", "rotating as it travels", "wheeling forward"),
        "sliding": ("slipping", "scooting", "skating"),
        "tumbling": ("flipping end on end", "cartwheeling", "turning head to tail repeatedly"),
        "falling": ("in free fall", "plummeting", "heading downward"),
        "flying": ("launched", "airborne and travelling", "hurtling"),
        "bouncing": ("springing back up", "ricocheting", "jumping up again"),
        "spinning": ("rotating in flight", "pirouetting", "gyrating"),
        "wobbling": ("swaying", "unsteady", "shaking in place"),
        "toppling": ("overbalancing", "capsizing", "losing its balance"),
        "pushed": ("propelled forward", "driven forward by the pusher", "nudged forward"),
        "hanging": ("suspended from the crane", "carried aloft by the hoist", "clamped in the grabber"),
        "crashing": ("colliding with {o}", "ramming {o}", "bumping hard into {o}"),
        "hit": ("bashed by {o}", "taking a blow from {o}", "bumped by {o}"),
    },
    place={
        "floor": ("down on the linoleum", "at the lowest level of the room"),
        "floor_table": ("down on the linoleum flanking the desk", "at the lowest level, alongside the desk"),
        "floor_ramp": ("down on the linoleum where the incline ends", "at the lowest level, past the slope"),
        "floor_container": ("down on the linoleum flanking the crate", "at the lowest level, alongside the tub"),
        "floor_shelf": ("down on the linoleum, plumb with the bracket", "at the lowest level, below the mounted board"),
        "table": ("on the desk surface", "upon the worktop"),
        "table_edge": ("by the desk's border", "close to where the desk ends"),
        "ramp_upper": ("up the slope", "at the summit of the incline"),
        "ramp_lower": ("down the slope", "at the foot of the incline"),
        "container": ("within the crate", "in the tub"),
        "rim": ("perched on the crate's lip", "balanced on the tub's border"),
        "shelf": ("upon the bracket", "on the mounted board"),
        "on_object": ("piled upon {o}", "perched upon {o}"),
        "wall": ("pressed to the partition", "flush with the partition"),
        "over_container": ("higher than the crate", "past the tub's mouth"),
        "air": ("aloft", "airborne"),
    },
    relation={
        "touching": ("in touch with {o}", "brushing {o}"),
        "leaning": ("slanting onto {o}", "supported sideways by {o}"),
        "next_to": ("alongside {o}", "by {o}", "close to {o}"),
        "under": ("below {o}", "trapped below {o}"),
    },
    pose={
        "upright": ("erect", "vertical"),
        "side": ("sideways", "horizontal"),
        "upside_down": ("inverted", "capsized"),
        "tilted": ("slanted", "askew"),
    },
    shape_nouns={"ball": ("sphere", "globe"), "wheel": ("disc", "hoop"), "cube": ("square block", "box"),
                 "brick": ("slab", "bar"), "domino": ("tile", "tall tile"), "plank": ("board", "beam"),
                 "wedge": ("ramp piece", "triangle"), "can": ("tin", "cylinder")},
    orders=(("O", "M", "R", "P"), ("P", "M", "R", "O"), ("M", "P", "O", "R")),
    determiners=("the", "that", "a"),
    omit={"pose": 0.35, "relation": 0.3, "place": 0.12},
)


def _pick(rng: np.random.Generator, options: tuple, zipf: float = 0.0):
    if zipf == 0.0 or len(options) == 1:
        return options[int(rng.integers(len(options)))]
    w = np.arange(1, len(options) + 1, dtype=np.float64) ** -zipf
    return options[int(np.searchsorted(np.cumsum(w / w.sum()), rng.random(), side="right").clip(0, len(options) - 1))]


def _noun_phrase(other: str, lex: Lexicon, rng: np.random.Generator) -> tuple[str, str]:
    """The other object as this lexicon names it, by its kind (``the cube``, ``a ball``), and the kind it denotes."""
    noun = _pick(rng, lex.shape_nouns[other], lex.form_zipf)
    return f"{_pick(rng, lex.determiners, lex.form_zipf)} {noun}", other


def describe(state: TrueState, rng: np.random.Generator, lex: Lexicon = CORPUS) -> tuple[str, Denotation]:
    """A free-form phrase for ``state`` in lexicon ``lex`` and its denotation (the values it mentions).

    The motion is always said; pose, relation and place are each left out with probability ``lex.omit``;
    a slot whose phrase names ``other`` renders it with `_noun_phrase`.
    """
    den: Denotation = {"motion": state.motion}
    other, other_name = _noun_phrase(state.other, lex, rng) if state.other else ("", "")
    z = lex.form_zipf
    verb = _pick(rng, lex.motion[state.motion], z).format(o=other)
    if state.motion in EVENT_MOTIONS:
        den["other"] = other_name
    slots = {"M": verb, "P": "", "R": "", "O": ""}
    if state.place and rng.random() >= lex.omit.get("place", 0.0):
        slots["P"] = _pick(rng, lex.place_forms(state.place), z).format(o=other)
        den["place"] = state.place
        if state.place == "on_object":
            den["other"] = other_name
    if state.relation and rng.random() >= lex.omit.get("relation", 0.0):
        slots["R"] = _pick(rng, lex.relation[state.relation], z).format(o=other)
        den["relation"] = state.relation
        den["other"] = other_name
    if state.pose and rng.random() >= lex.omit.get("pose", 0.0):
        slots["O"] = _pick(rng, lex.pose[state.pose], z)
        den["pose"] = state.pose
    order = _pick(rng, lex.orders, z)
    return " ".join(slots[s] for s in order if slots[s]), den


def reference_text(state: TrueState) -> str:
    """The complete rendering of ``state`` with the first corpus word of every slot (deterministic): the state
    text of the simulator-truth benchmark."""
    other = f"a {state.other}" if state.other else ""
    parts = [CORPUS.motion[state.motion][0].format(o=other)]
    if state.place:
        parts.append(CORPUS.place_forms(state.place)[0].format(o=other))
    if state.relation:
        parts.append(CORPUS.relation[state.relation][0].format(o=other))
    if state.pose:
        parts.append(CORPUS.pose[state.pose][0])
    return " ".join(parts)


def corpus_words() -> set[str]:
    """Every content word the corpus lexicon can write (the held-out lexicon is checked against it)."""
    words: set[str] = set()
    for table in (CORPUS.motion, CORPUS.place, CORPUS.relation, CORPUS.pose, CORPUS.shape_nouns):
        for forms in table.values():
            for f in forms:
                words |= set(f.replace("{o}", "").replace("'s", "").split())
    return words
