"""The scene-family and surface registries of the synthetic generator: a family (with a surface of its own) declared
in this test module alone is simulated, labelled, described, rendered and made into a video by the generator."""

from __future__ import annotations

import numpy as np
import pytest

from eval.synth import lexicon, scenes, states, surfaces
from eval.synth import record as R
from eval.synth import video as V

MAT_WORDS = {"corpus": ("on the mat", "on the pad"), "held-out": ("upon the cushion", "atop the padding")}


@pytest.fixture
def registries(monkeypatch):
    """Fresh copies of both registries for one test (what it registers is gone afterwards)."""
    monkeypatch.setattr(scenes, "REGISTRY", dict(scenes.REGISTRY))
    monkeypatch.setattr(surfaces, "SURFACES", dict(surfaces.SURFACES))


MAT_X_U = (150.0, 250.0)
MAT_TOP_U = 28.0
DROP_Y_U = (120.0, 200.0)


def _register_mat_family(weight: float = 1.0) -> None:
    """A family with a new surface, declared here only: cubes dropped onto a springy mat on the floor."""
    surfaces.surface("mat", contact=R.CONTACT_FLOOR, friction=0.9, elasticity=0.8, landing=True, place="mat",
                     words=MAT_WORDS)

    @scenes.family("mat_drop", domains={"playroom": scenes.Share(weight, slot=4),
                                        "workshop": scenes.Share(weight, slot=3)})
    def build_mat_drop(rng: np.random.Generator) -> scenes.World:
        world = scenes.World("mat_drop")
        world.add_static("mat", [(MAT_X_U[0], scenes.FLOOR_Y), (MAT_X_U[1], scenes.FLOOR_Y),
                                 (MAT_X_U[1], MAT_TOP_U), (MAT_X_U[0], MAT_TOP_U)])
        specs = scenes.pick_objects(rng, ["cube", "brick", "cube"])
        for k, spec in enumerate(specs):
            x = MAT_X_U[0] + 20.0 + 30.0 * k
            world.add_object(spec, (x, float(rng.uniform(*DROP_Y_U))), release=0.3 + 0.5 * k)
        return world.mirror_if(rng.random() < scenes.P_MIRROR)


def test_a_family_with_a_new_surface_is_registered_in_one_place(registries):
    before = scenes.domain_mixtures()
    _register_mat_family()
    assert scenes.families()[-1] == "mat_drop"
    mixtures = scenes.domain_mixtures()
    assert list(mixtures["playroom"]) == [*before["playroom"], "mat_drop"]  # slot 4: after the four built-in
    assert mixtures["kitchen"] == before["kitchen"]
    mat = surfaces.get("mat")
    assert mat.support > max(s.support for s in surfaces.SURFACES.values() if s.kind != "mat")
    assert surfaces.contact_bit(mat.support) == R.CONTACT_FLOOR and mat.support in surfaces.landing_codes()


def test_the_new_family_is_simulated_labelled_described_and_rendered(registries):
    _register_mat_family()
    rec = scenes.simulate("mat_drop", np.random.default_rng(3))
    assert rec.family == "mat_drop" and "mat" in {str(k) for k in rec.static_kind}
    assert (rec.support == surfaces.get("mat").support).any()
    places = {seg.state.place for traj in states.trajectories(rec) for seg in traj}
    assert "mat" in places
    state = lexicon.TrueState("at_rest", "mat")
    assert lexicon.reference_text(state) == "resting on the mat"
    rng = np.random.default_rng(0)
    for lex in (lexicon.CORPUS, lexicon.HELD_OUT):
        phrases = {lexicon.describe(state, rng, lex)[0] for _ in range(30)}
        assert any(any(w in p for w in MAT_WORDS[lex.name]) for p in phrases)


def test_the_new_family_makes_a_whole_video(registries, tmp_path):
    _register_mat_family(weight=1e6)  # the domain draws it
    res = V.make_video(0, 0, "playroom", str(tmp_path), (64, 48))
    assert res.family == "mat_drop" and res.segments
    assert any(s.state.place == "mat" for s in res.segments)
    assert (tmp_path / "sim" / f"{res.video_id}.npz").is_file()
    assert len(list((tmp_path / "frames" / res.video_id).iterdir())) > 0


def test_registration_errors_name_what_is_wrong(registries):
    with pytest.raises(ValueError, match="already registered"):
        scenes.family("ramp", domains={"workshop": scenes.Share(0.1, slot=9)})(lambda rng: None)
    with pytest.raises(ValueError, match="unknown domain 'garden'"):
        scenes.family("x", domains={"garden": scenes.Share(0.1, slot=0)})(lambda rng: None)
    with pytest.raises(ValueError, match="slot 0 of domain 'workshop' is taken"):
        scenes.family("x", domains={"workshop": scenes.Share(0.1, slot=0)})(lambda rng: None)
    with pytest.raises(ValueError, match="needs words"):
        surfaces.surface("mat", contact=R.CONTACT_FLOOR, friction=0.5, elasticity=0.5, place="mat")
    with pytest.raises(ValueError, match="unknown scene family 'nope'"):
        scenes.simulate("nope", np.random.default_rng(0))
    with pytest.raises(KeyError, match="unknown surface 'nope'"):
        scenes.World("x").add_static("nope", [(0.0, 0.0), (1.0, 0.0), (1.0, 1.0)])


def test_the_registries_hold_the_built_in_families_and_surfaces():
    assert scenes.families() == ("ramp", "table_push", "dominoes", "container", "stack", "shelf", "billiards")
    assert scenes.domain_mixtures()["playroom"] == {"billiards": 0.40, "dominoes": 0.20, "container": 0.20,
                                                     "ramp": 0.20}
    bits = surfaces.contact_bits()
    assert bits[R.SUPPORT_SHELF] == R.CONTACT_TABLE and bits[R.SUPPORT_OBJECT] == R.CONTACT_OBJECT
    assert not hasattr(scenes, "BUILDERS") and not hasattr(scenes, "DOMAIN_MIXTURES")


def test_the_package_docstring_describes_the_generator_as_it_is():
    import eval.synth
    from eval.synth.build import PRESETS

    doc = " ".join(eval.synth.__doc__.split())
    for name in (*scenes.families(), *scenes.DOMAINS):
        assert f"``{name}``" in doc, name
    for name, p in PRESETS.items():
        assert f"``{name}``" in doc and f"{p.videos} videos" in doc, name
        assert f"{p.image_size[0]} x {p.image_size[1]}" in doc, name
        if p.query_videos is not None:
            assert f"{p.query_videos} of them with queries" in doc, name
    assert "vocab" not in doc.replace("vocabulary", "")
