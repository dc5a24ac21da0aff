"""dstack's name rules (matched as a whole), instants as epoch seconds, and lazily parsed stored JSON."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.domain.documents import LazyJSON, json_default, spec_configuration
from corral.domain.names import ADJECTIVES, NOUNS, project_name_error, random_words, resource_name_error, username_error
from corral.domain.times import epoch_seconds


def test_resource_names_start_with_a_letter_and_hold_2_to_41_lowercase_characters() -> None:
    for ok in ("ab", "my-run-1", "a" + "b" * 40):
        assert resource_name_error(ok) is None
    for bad in ("a", "1run", "My-run", "run_1", "a" + "b" * 41, "run\n", 7, None):
        assert resource_name_error(bad) == "Resource name should match regex '^[a-z][a-z0-9-]{1,40}$'"


def test_usernames_and_project_names_have_their_own_alphabets_and_lengths() -> None:
    assert username_error("Ann_B-1") is None
    assert username_error("u" * 60) is None
    assert username_error("u" * 61) == "Username should match regex '^[a-zA-Z0-9-_]{1,60}$'"
    assert username_error("ann\n") is not None  # dstack's re.match would accept the final newline
    assert username_error("") is not None
    assert project_name_error("Main_1") is None
    assert project_name_error("p" * 51) == "Project name should match regex '^[a-zA-Z0-9-_]{1,50}$'"
    assert project_name_error("a b") is not None


def test_a_naive_instant_is_utc_and_an_aware_one_counts_its_offset() -> None:
    assert epoch_seconds(datetime(1970, 1, 1)) == 0.0
    assert epoch_seconds(datetime(1970, 1, 1, 1, tzinfo=timezone(timedelta(hours=1)))) == 0.0
    assert epoch_seconds(datetime(1969, 12, 31, 23, 59, 59, tzinfo=timezone.utc)) == -1.0


def test_instants_at_the_ends_of_the_calendar_convert() -> None:
    early = datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5)))
    assert epoch_seconds(early) == (datetime(1, 1, 1) - datetime(1970, 1, 1)).total_seconds() - 5 * 3600
    late = datetime(9999, 12, 31, 23, 59, tzinfo=timezone(timedelta(hours=-5)))
    assert epoch_seconds(late) == (datetime(9999, 12, 31, 23, 59) - datetime(1970, 1, 1)).total_seconds() + 5 * 3600


@given(st.datetimes(), st.integers(min_value=-23 * 60, max_value=23 * 60))
def test_an_offset_moves_an_instant_by_exactly_that_offset(naive: datetime, minutes: int) -> None:
    aware = naive.replace(tzinfo=timezone(timedelta(minutes=minutes)))
    assert epoch_seconds(aware) == pytest.approx(epoch_seconds(naive) - minutes * 60, abs=1e-3)


def test_a_lazy_document_reads_as_the_mapping_it_stores() -> None:
    doc = LazyJSON('{"a": 1, "b": [2]}')
    assert doc.raw == b'{"a": 1, "b": [2]}'
    assert doc["a"] == 1 and list(doc) == ["a", "b"] and len(doc) == 2
    assert dict(doc) == {"a": 1, "b": [2]}
    assert LazyJSON(b'{"a":1}')["a"] == 1


def test_lazy_documents_are_equal_by_text_or_by_content_and_unhashable() -> None:
    assert LazyJSON('{"a":1}') == LazyJSON('{"a":1}')
    assert LazyJSON('{"a":1}') == LazyJSON('{ "a" : 1 }')
    assert LazyJSON('{"a":1}') != LazyJSON('{"a":2}')
    assert LazyJSON('{"a":1}') == {"a": 1}
    with pytest.raises(TypeError):
        hash(LazyJSON("{}"))
    assert repr(LazyJSON('{"a":1}')) == "LazyJSON(b'{\"a\":1}'...)"


def test_a_lazy_document_is_embedded_in_json_as_stored_without_parsing() -> None:
    doc = LazyJSON('{"spec": {"x": 1}}')
    out = orjson.dumps({"run": doc}, default=json_default)
    assert out == b'{"run":{"spec": {"x": 1}}}'
    assert doc._value is None  # never parsed
    with pytest.raises(TypeError, match="Type is not JSON serializable: set"):
        orjson.dumps({"x": {1}}, default=json_default)


def test_a_run_specs_configuration_is_read_as_a_mapping_or_else_empty() -> None:
    assert spec_configuration(LazyJSON('{"configuration": {"type": "task"}}')) == {"type": "task"}
    assert spec_configuration({"configuration": {"type": "service"}}) == {"type": "service"}
    assert spec_configuration(None) == {}
    assert spec_configuration({}) == {}
    assert spec_configuration({"configuration": "task"}) == {}  # an older or broken document


def test_a_stored_fleet_spec_gives_its_configuration_or_nothing() -> None:
    assert spec_configuration({"configuration": {"type": "fleet", "nodes": 2}}) == {"type": "fleet", "nodes": 2}
    assert spec_configuration(None) == {} and spec_configuration({"configuration": "not a document"}) == {}


def test_a_generated_name_starts_with_an_adjective_and_an_animal() -> None:
    adjective, animal = random_words().split("-")
    assert adjective in ADJECTIVES and animal in NOUNS
