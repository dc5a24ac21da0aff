"""dstack's permission rules: who reaches a project route, who may change its members, who adds importers
to an export or makes it global, and which computes a project may use."""

from __future__ import annotations

import pytest

from corral.domain.access import (
    RULES,
    Denied,
    backend_types,
    can_manage_secrets,
    check_add_members,
    check_export_global,
    check_export_importers,
    check_remove_members,
    check_set_members,
    may_reach,
    reads_all_events,
    usable_computes,
)

FORBIDDEN_ADD = Denied(403, "Access denied: insufficient permissions to add members")
FORBIDDEN_REMOVE = Denied(403, "Access denied: insufficient permissions to remove members")


@pytest.mark.parametrize("rule", RULES)
def test_a_global_admin_reaches_every_route_even_of_a_private_project_they_are_not_in(rule: str) -> None:
    assert may_reach(rule, "admin", None, False)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("rule", "reached_by"),
    [
        ("member", {"admin", "manager", "user"}),
        ("member_or_public", {"admin", "manager", "user", "public"}),
        ("manager", {"admin", "manager"}),
        ("manager_or_public", {"admin", "manager", "public"}),
        ("admin", {"admin"}),
    ],
)
def test_each_route_rule_lets_in_exactly_its_project_roles(rule: str, reached_by: set[str]) -> None:
    for role in ("admin", "manager", "user"):
        assert may_reach(rule, "user", role, False) is (role in reached_by)  # type: ignore[arg-type]
    # a non-member reaches only the public-project rules, and only when the project is public
    assert may_reach(rule, "user", None, True) is ("public" in reached_by)  # type: ignore[arg-type]
    assert not may_reach(rule, "user", None, False)  # type: ignore[arg-type]


def test_an_unknown_rule_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown access rule 'owner'"):
        may_reach("owner", "user", "admin", False)  # type: ignore[arg-type]


def test_only_global_admins_read_every_event() -> None:
    assert reads_all_events("admin")
    assert not reads_all_events("user")


def test_secrets_are_managed_by_admins_and_by_managers_only_when_the_server_allows_it() -> None:
    assert can_manage_secrets("admin", None)
    assert can_manage_secrets("user", "admin")
    assert not can_manage_secrets("user", "manager")
    assert can_manage_secrets("user", "manager", managers_may=True)
    assert not can_manage_secrets("user", "user", managers_may=True)


def test_setting_members_refuses_the_same_user_twice() -> None:
    new = [("ann", "user"), ("ann", "admin")]
    assert check_set_members("admin", None, new, []) == Denied(400, "Cannot add same user multiple times")


def test_a_manager_sets_members_but_must_leave_the_admins_as_they_are() -> None:
    current = [("boss", "admin"), ("ann", "user")]
    assert check_set_members("user", "manager", [("boss", "admin"), ("ann", "manager")], current) is None
    promoted = [("boss", "admin"), ("ann", "admin")]
    assert check_set_members("user", "manager", promoted, current) == Denied(
        403, "Access denied: changing project admins"
    )
    # a project admin or a global admin may change them
    assert check_set_members("user", "admin", promoted, current) is None
    assert check_set_members("admin", "manager", promoted, current) is None


def test_adding_members_refuses_the_same_user_twice() -> None:
    new = [("ann", "user"), ("ann", "user")]
    assert check_add_members("admin", "root", None, None, False, new) == Denied(
        400, "Cannot add same user multiple times"
    )


def test_anyone_may_join_a_public_project_alone_and_only_as_user() -> None:
    assert check_add_members("user", "ann", "ann@x.io", None, True, [("ann", "user")]) is None
    assert check_add_members("user", "ann", "ann@x.io", None, True, [("ann@x.io", "user")]) is None
    assert check_add_members("user", "ann", None, None, True, [("ann", "manager")]) == Denied(
        403, "Access denied: can only join public projects as user role"
    )
    # not public, or adding someone else: an ordinary add, which a non-member may not make
    assert check_add_members("user", "ann", None, None, False, [("ann", "user")]) == FORBIDDEN_ADD
    assert check_add_members("user", "ann", None, None, True, [("bob", "user")]) == FORBIDDEN_ADD


def test_members_are_added_by_managers_and_admins_but_admins_not_by_managers() -> None:
    assert check_add_members("user", "m", None, "user", False, [("bob", "user")]) == FORBIDDEN_ADD
    assert check_add_members("user", "m", None, "manager", False, [("bob", "manager")]) is None
    assert check_add_members("user", "m", None, "manager", False, [("bob", "admin")]) == Denied(
        403, "Access denied: only global admins can add project admins"
    )
    assert check_add_members("user", "a", None, "admin", False, [("bob", "admin")]) is None
    assert check_add_members("admin", "root", None, None, False, [("bob", "admin")]) is None


def test_a_plain_member_may_leave_but_not_remove_others() -> None:
    assert check_remove_members("user", "ann", None, "user", [("ann", "user")], 1) is None
    assert check_remove_members("user", "ann", "ann@x.io", "user", [("ann@x.io", "user")], 1) is None
    assert check_remove_members("user", "ann", None, "user", [("bob", "user")], 1) == FORBIDDEN_REMOVE
    # a non-member cannot "leave"
    assert check_remove_members("user", "ann", None, None, [("ann", None)], 1) == FORBIDDEN_REMOVE


def test_removing_names_unknown_users_and_non_members_with_their_names() -> None:
    assert check_remove_members("admin", "root", None, None, [("ghost", "?")], 1) == Denied(
        400, "User not found: ghost"
    )
    assert check_remove_members("admin", "root", None, None, [("bob", None)], 1) == Denied(
        400, "User is not a member of this project: bob"
    )


def test_the_last_admin_cannot_leave_but_one_of_two_may() -> None:
    assert check_remove_members("user", "a", None, "admin", [("a", "admin")], 1) == Denied(
        400, "Cannot leave project: you are the last admin"
    )
    assert check_remove_members("user", "a", None, "admin", [("a", "admin")], 2) is None


def test_only_global_admins_remove_project_admins_and_never_all_of_them() -> None:
    assert check_remove_members("user", "a", None, "admin", [("b", "admin")], 2) == Denied(
        403, "Access denied: only global admins can remove project admins (user: b)"
    )
    assert check_remove_members("admin", "root", None, None, [("b", "admin")], 2) is None
    assert check_remove_members("admin", "root", None, None, [("a", "admin"), ("b", "admin")], 2) == Denied(
        400, "Cannot remove all project admins"
    )
    assert check_remove_members("user", "m", None, "manager", [("u", "user")], 1) is None


def test_backend_types_are_the_named_types_of_the_stored_backends() -> None:
    stored = [{"type": "local"}, {"type": "aws", "regions": []}, {"name": "no type"}, "junk", {"type": ""}]
    assert backend_types(stored) == frozenset({"local", "aws"})  # type: ignore[arg-type]


def test_a_project_uses_only_the_computes_its_backends_name_in_their_order() -> None:
    assert usable_computes(["local", "aws", "gcp"], frozenset({"gcp", "local"})) == ["local", "gcp"]
    assert usable_computes(["local"], frozenset()) == []


def test_importers_are_added_only_by_admins_of_those_projects_and_each_once() -> None:
    roles = {"alpha": "admin", "beta": "manager", "gamma": None}
    assert check_export_importers("user", ["Alpha"], roles) is None
    assert check_export_importers("user", ["alpha", "ALPHA"], roles) == Denied(
        400, "Some importer projects are listed for addition more than once"
    )
    denied = check_export_importers("user", ["gamma", "beta", "alpha", "missing"], roles)
    assert denied == Denied(
        400,
        "Projects {'beta', 'gamma', 'missing'} not found or you are not allowed to add them as importers."
        " Only project admins can add a project as importer",
    )
    # a global admin adds any existing project, but not one that does not exist
    assert check_export_importers("admin", ["beta", "gamma"], roles) is None
    assert check_export_importers("admin", ["missing"], roles) is not None


def test_only_global_admins_make_an_export_global() -> None:
    assert check_export_global("admin") is None
    assert check_export_global("user") == Denied(403, "Only global admins can make the export global")
