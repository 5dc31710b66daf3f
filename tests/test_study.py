"""A study is its experiment file composed once (config.study): the typed question every reader gets,
checked key by key, and the grid Hydra would sweep."""

from __future__ import annotations

import pytest

from attnlab.config.study import DEFAULT_HEADLINE, Question, load_study, study_names
from attnlab.util.errors import ConfigError


def test_a_child_experiment_inherits_its_parents_question_and_grid():
    """gqa_long extends kv_frontier, which extends mqar: Hydra merges them as a run does."""
    child, parent = load_study("gqa_long"), load_study("kv_frontier")
    assert child.question.axis == "model.n_kv_head" and child.question.outcome == "learned"
    assert set(parent.grid) <= set(child.grid) and child.grid["model.n_kv_head"]
    smoke = load_study("smoke")  # dk_scaling's question at one seed, the default headline
    assert smoke.question.axis == load_study("dk_scaling").question.axis and smoke.question.seeds == 1
    assert smoke.question.headline == DEFAULT_HEADLINE


def test_a_study_carries_its_models_depth():
    """The dashboard's per-layer panels follow the depth the experiment trains, its preset's or its own."""
    from attnlab.config.compose import compose_config

    for name in ("induction_heads", "dk_scaling", "mqar"):
        assert load_study(name).n_layer == compose_config([f"experiment={name}"]).model.n_layer
    assert load_study("induction_heads").n_layer == 2


@pytest.mark.parametrize("study", study_names())
def test_every_committed_question_is_typed(study):
    q = load_study(study).question
    assert isinstance(q.metrics, tuple) and q.metrics and all(isinstance(m, str) for m in q.metrics)
    assert q.seeds == "auto" or q.seeds >= 1
    assert q.reference is None or isinstance(q.reference, str)


@pytest.mark.parametrize(
    "block,key",
    [
        ({"axs": "variant"}, "question.axs"),
        ({"outcome": "average"}, "question.outcome"),
        ({"outcome": "onset"}, "question.learned"),
        ({"seeds": 0}, "question.seeds"),
        ({"seeds": "many"}, "question.seeds"),
    ],
)
def test_a_bad_question_key_is_one_line_naming_it(block, key):
    with pytest.raises(ConfigError) as err:
        Question.from_block(block)
    assert str(err.value).startswith(f"{key}=") and "expected" in str(err.value) and "\n" not in str(err.value)


def test_an_unknown_study_names_the_studies():
    with pytest.raises(ConfigError) as err:
        load_study("no_such_study")
    assert str(err.value).startswith("experiment='no_such_study'") and "kv_frontier" in str(err.value)
