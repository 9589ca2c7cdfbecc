"""The benchmark schema: the Arrow features and the validator's field tables that `eval.schema` declares.

The expectations below are literal copies of the schema as it was declared by hand (three times: the dataclasses,
the `datasets.Features`, the validator's field tables) before both were derived from the dataclasses; they prove
that the derivation changed nothing, field order included.
"""

from __future__ import annotations

import datasets
from datasets import List, Value

from eval import schema

_ids = List(Value("string"))

EXPECTED_QUERY_FEATURES = datasets.Features({
    "id": Value("string"), "prefix_id": Value("string"), "video_id": Value("string"), "domain": Value("string"),
    "object_id": Value("string"), "subject": Value("string"), "qtype": Value("string"), "horizon": Value("int32"),
    "question": Value("string"), "target_state": Value("string"), "target_state_id": Value("string"),
    "target_state_type1": Value("string"), "target_time": Value("float64"), "prefix_start": Value("float64"),
    "prefix_end": Value("float64"), "prefix_frames": _ids,
    "transcript": List({"t": Value("float64"), "state": Value("string")}),
    "split": Value("string"),
    "gt_pools": {"in_video": _ids, "in_dataset": _ids, "cross_dataset": _ids, "bge_similar": _ids, "consensus": _ids},
    "gt_type1": _ids, "fair": Value("bool"), "group_id": Value("string"), "k_seconds": Value("float64"),
    "anchor_state": Value("string"), "gt_sim_exact": _ids, "prefix_boxes": List(List(Value("float32"))),
})
EXPECTED_SEGMENT_FEATURES = datasets.Features({
    "id": Value("string"), "video_id": Value("string"), "domain": Value("string"), "object_id": Value("string"),
    "subject": Value("string"), "state": Value("string"), "state_id": Value("string"),
    "state_type1": Value("string"), "start": Value("float64"), "end": Value("float64"), "frame": Value("string"),
    "raw": Value("string"), "sim_state": Value("string"), "box": List(Value("float32")),
})
EXPECTED_STATE_FEATURES = datasets.Features({
    "id": Value("string"), "text": Value("string"), "members": _ids, "n_segments": Value("int64"),
})

num = (int, float)
EXPECTED_FIELDS = {
    "query": (
        {"id": str, "prefix_id": str, "video_id": str, "domain": str, "object_id": str, "subject": str,
         "qtype": str, "horizon": int, "question": str, "target_state": str, "target_state_id": str,
         "target_state_type1": str, "target_time": num, "prefix_start": num, "prefix_end": num,
         "prefix_frames": list, "transcript": list, "split": str, "gt_pools": dict},
        {"gt_type1": list, "fair": bool, "group_id": str, "k_seconds": num, "anchor_state": str,
         "gt_sim_exact": list, "prefix_boxes": list},
    ),
    "segment": (
        {"id": str, "video_id": str, "domain": str, "object_id": str, "subject": str, "state": str, "state_id": str,
         "state_type1": str, "start": num, "end": num, "frame": str},
        {"raw": str, "sim_state": str, "box": list},
    ),
    "state": ({"id": str, "text": str}, {"members": list, "n_segments": int}),
}


def _same_features(got: datasets.Features, want: datasets.Features) -> None:
    assert repr(got) == repr(want)  # dict equality ignores key order; the repr does not
    assert got == want
    assert got.arrow_schema.equals(want.arrow_schema)


def test_arrow_features_are_unchanged():
    _same_features(schema.QUERY_FEATURES, EXPECTED_QUERY_FEATURES)
    _same_features(schema.SEGMENT_FEATURES, EXPECTED_SEGMENT_FEATURES)
    _same_features(schema.STATE_FEATURES, EXPECTED_STATE_FEATURES)


def test_validator_field_tables_are_unchanged():
    got = {
        "query": (schema.REQUIRED_QUERY_FIELDS, schema.OPTIONAL_QUERY_FIELDS),
        "segment": (schema.REQUIRED_SEGMENT_FIELDS, schema.OPTIONAL_SEGMENT_FIELDS),
        "state": (schema.REQUIRED_STATE_FIELDS, schema.OPTIONAL_STATE_FIELDS),
    }
    for name, (required, optional) in EXPECTED_FIELDS.items():
        assert list(got[name][0].items()) == list(required.items()), name
        assert list(got[name][1].items()) == list(optional.items()), name


def test_query_value_rules_are_the_validator_checks():
    assert schema.QUERY_RULES == {
        "qtype": {"choices": ("Q1", "Q2", "Q3", "Q4", "Q5"), "label": "question type"},
        "horizon": {"range": (1, 7)},
        "split": {"choices": ("train", "val", "test"), "label": "split"},
    }
    assert list(schema.QUERY_RULES) == ["qtype", "horizon", "split"]  # the validator's order of checks
    assert schema.field_rules(schema.Segment) == {} and schema.field_rules(schema.State) == {}


def test_gt_pools_struct_follows_the_tiers():
    assert tuple(schema.QUERY_FEATURES["gt_pools"]) == schema.GT_TIERS
    assert tuple(f.name for f in schema.fields(schema.GTPools)) == schema.GT_TIERS
