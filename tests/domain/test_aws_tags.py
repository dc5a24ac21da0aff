"""The tags corral puts on EC2 resources: an admin's and a fleet's within AWS's limits beside corral's own.

AWS's limits here are this test's own (EC2 User Guide, "Tag your Amazon EC2 resources", Tag restrictions: 50
tags per resource, keys 1-128 characters, values at most 256, ``aws:`` reserved)."""

from __future__ import annotations

from corral.domain import aws_tags

#: AWS's 50 tags per resource, less the 8 keys corral writes on a gang member in a placement group.
ROOM = 50 - 8


def test_tags_within_the_room_corral_leaves_pass() -> None:
    assert aws_tags.problem({}, "tags") is None
    assert aws_tags.problem({f"k{i}": "v" for i in range(ROOM)}, "tags") is None
    assert aws_tags.problem({"team": "ml/platform @ corp", "cost-center": "a+b=c.d:e_f"}, "tags") is None
    assert aws_tags.problem({"k" * 128: "v" * 256}, "tags") is None


def test_too_many_tags_are_refused_naming_the_field_and_the_count() -> None:
    why = aws_tags.problem({f"k{i}": "v" for i in range(ROOM + 1)}, "fleet tags")
    assert why is not None and why.startswith("fleet tags: 43 tags, at most 42") and "50" in why


def test_keys_and_values_break_awss_rules() -> None:
    assert "keys are 1-128" in str(aws_tags.problem({"k" * 129: "v"}, "tags"))
    assert "keys are 1-128" in str(aws_tags.problem({"": "v"}, "tags"))
    assert "values at most 256" in str(aws_tags.problem({"k": "v" * 257}, "tags"))
    assert "reserved for AWS" in str(aws_tags.problem({"AWS:team": "ml"}, "tags"))
    assert "reserved for AWS" in str(aws_tags.problem({"team": "aws:ml"}, "tags"))
    assert "letters, digits" in str(aws_tags.problem({"team": "ml;rm -rf"}, "tags"))
    assert "letters, digits" in str(aws_tags.problem({"te#am": "ml"}, "tags"))


def test_corrals_own_keys_are_refused() -> None:
    why = aws_tags.problem({"corral_fleet": "x", "team": "ml"}, "tags")
    assert why == "tags: corral_fleet is corral's own tag: use another key"
    assert "Name is corral's own" in str(aws_tags.problem({"Name": "x"}, "tags"))


def test_a_fleets_tags_win_over_the_backends_and_names_are_cut_to_256() -> None:
    assert aws_tags.joined({"team": "ml", "env": "prod"}, {"team": "research"}) == {"team": "research", "env": "prod"}
    assert aws_tags.joined(None, None) == {}
    assert aws_tags.name_tag("main", "fl-0") == "corral-main-fl-0"
    assert len(aws_tags.name_tag("p" * 300, "x")) == 256
