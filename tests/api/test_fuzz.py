"""The API against its own OpenAPI document, on one real server seeded with data of every kind
(``live_server.py``):

- every route called with real names and ids, each answer checked against the document (its status is
  one the route documents, its body matches that status's schema): the response models cannot drift from
  what the services build;
- the bounded fuzzing run: schemathesis generates requests for every route from the document (valid
  bodies and invalid ones), with the admin's token, ``FUZZ_EXAMPLES`` per route and per mode; no answer
  may be a 5xx, and every answer must match the document for its status.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from live_server import RESOURCES, Seeded, live_server, seed
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from corral.api.app import TABLES

#: examples per route of each generation mode: valid requests (the deeper paths) and invalid ones (which
#: mostly stop at validation). CI's cost: about 2 minutes for the 70 routes on 2 cores, seeding included
#: (the generation is most of it); the test prints its figures.
FUZZ_EXAMPLES = {GenerationMode.POSITIVE: 25, GenerationMode.NEGATIVE: 8}
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]

#: Routes the fuzzer leaves out, and why: each would end the run for every route after it.
NOT_FUZZED = {
    # a random username that happened to be the admin's would rotate the token the fuzzer uses
    ("POST", "/api/users/refresh_token"),
}


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    with live_server(tmp_path_factory.mktemp("fuzz")) as s:
        seed(s)
        yield s


def _real_values(seeded: Seeded, path: str) -> dict[str, Any]:
    """Names and ids of the seeded data, by body field, for the route at ``path``."""
    ids = seeded.ids
    if path.endswith(("/delete", "/delete_instances", "/stop")):
        return {}  # the seeded data stays for the routes fuzzed after these
    values: dict[str, Any] = {
        "run_name": seeded.run,
        "job_submission_id": ids["job_submission_id"],
        "fleet_name": seeded.fleet,
        "instance_num": ids["instance_num"],
        "repo_id": seeded.repo,
        "username": seeded.user,
        "export_name": seeded.export,
        "export_project_name": seeded.project,
        "project_name": seeded.project,
        "project_names": [seeded.project],
        "fleet_ids": [ids["fleet_id"]],
    }
    if "/fleets/" in path:
        values.update(name=seeded.fleet, names=[seeded.fleet], id=ids["fleet_id"])
    if "/exports/" in path:
        values.update(name=seeded.export)
    if "/instances/get" in path:
        values.update(id=ids["instance_id"])
    return values


@pytest.fixture(scope="module")
def api(seeded: Seeded) -> Any:
    doc = httpx.get(seeded.url + "/api/openapi.json").json()
    schema = schemathesis.openapi.from_dict(doc)

    @schema.hook
    def flatmap_body(context: Any, body: Any) -> Any:
        """Half the bodies name the seeded data where they name anything: random names are all "not
        found", which would leave every path past the lookup unfuzzed (the runs' logs, a fleet's pages)."""
        if not isinstance(body, dict) or context.operation is None:
            return st.just(body)
        real = {k: v for k, v in _real_values(seeded, context.operation.path).items() if k in body}
        if not real:
            return st.just(body)
        return st.sampled_from([body, {**body, **real}])

    return schema


def _operation(api: Any, method: str, path: str) -> Any:
    return api[path][method]


def _state(local_port: int | None) -> str:
    return base64.b64encode(json.dumps({"value": "abc", "local_port": local_port}).encode()).decode()


def _calls(s: Seeded) -> list[tuple[str, str, dict[str, Any]]]:
    """(method, path template, request) for every route, with the seeded names and ids."""
    p = "/api/project/{project_name}"
    task = {"type": "task", "commands": ["true"], "fleets": [s.fleet], "resources": RESOURCES}
    fleet_conf = {"type": "fleet", "name": s.fleet, "nodes": "1", "resources": RESOURCES}
    gateway = {"type": "gateway", "name": "g", "backend": "aws", "region": "eu-west-1", "domain": "example.com"}
    volume = {"type": "volume", "name": "v", "backend": "aws", "region": "eu-west-1", "size": 100}
    archive = io.BytesIO(b"an archive")
    digest = hashlib.sha256(b"an archive").hexdigest()
    return [
        ("GET", "/healthcheck", {}),
        ("GET", "/metrics", {}),
        ("POST", "/api/server/get_info", {}),
        ("POST", "/api/backends/list_types", {}),
        ("POST", "/api/users/get_my_user", {}),
        ("POST", "/api/users/get_user", {"json": {"username": s.user}}),
        ("POST", "/api/users/list", {"json": {}}),
        ("POST", "/api/users/list", {"json": {"return_total_count": True}}),
        ("POST", "/api/users/create", {"json": {"username": "fuzz-user-2", "global_role": "user"}}),
        ("POST", "/api/users/update", {"json": {"username": "fuzz-user-2", "global_role": "admin"}}),
        ("POST", "/api/users/refresh_token", {"json": {"username": "fuzz-user-2"}}),
        ("POST", "/api/users/refresh_ssh_key", {"json": {"username": "fuzz-user-2"}}),
        ("POST", "/api/users/delete", {"json": {"users": ["fuzz-user-2"]}}),
        ("POST", "/api/users/public_keys/list", {}),
        ("POST", "/api/users/public_keys/add", {"json": {"key": "not a key"}}),
        ("POST", "/api/users/public_keys/delete", {"json": {"ids": [str(uuid.uuid4())]}}),
        ("POST", "/api/projects/list", {"json": {}}),
        ("POST", "/api/projects/list", {"json": {"return_total_count": True}}),
        ("POST", "/api/projects/list_only_no_fleets", {}),
        ("POST", "/api/projects/create", {"json": {"project_name": "fuzz-p2"}}),
        ("POST", "/api/projects/delete", {"json": {"projects_names": ["fuzz-p2"]}}),
        ("POST", "/api/projects/{project_name}/get", {}),
        ("POST", "/api/projects/{project_name}/update", {"json": {"is_public": False}}),
        (
            "POST",
            "/api/projects/{project_name}/set_members",
            {"json": {"members": [{"username": "admin", "project_role": "admin"}]}, "project": s.other_project},
        ),
        (
            "POST",
            "/api/projects/{project_name}/add_members",
            {"json": {"members": [{"username": s.user, "project_role": "user"}]}, "project": s.other_project},
        ),
        (
            "POST",
            "/api/projects/{project_name}/remove_members",
            {"json": {"usernames": [s.user]}, "project": s.other_project},
        ),
        ("POST", "/api/fleets/list", {"json": {}}),
        ("POST", p + "/fleets/list", {"json": {"include_imported": True}, "project": s.other_project}),
        ("POST", p + "/fleets/get", {"json": {"name": s.fleet}}),
        ("POST", p + "/fleets/get_plan", {"json": {"spec": {"configuration": fleet_conf, "profile": {}}}}),
        (
            "POST",
            p + "/fleets/apply",
            {"json": {"plan": {"spec": {"configuration": fleet_conf, "profile": {}}}, "force": True}},
        ),
        ("POST", p + "/fleets/delete", {"json": {"names": ["no-such-fleet"]}}),
        ("POST", p + "/fleets/delete_instances", {"json": {"name": s.fleet, "instance_nums": [99]}}),
        ("POST", "/api/instances/list", {"json": {}}),
        ("POST", p + "/instances/get", {"json": {"id": s.ids["instance_id"]}}),
        (
            "POST",
            p + "/instances/get_instance_health_checks",
            {"json": {"fleet_name": s.fleet, "instance_num": s.ids["instance_num"]}},
        ),
        ("POST", "/api/runs/list", {"json": {}}),
        ("POST", p + "/runs/list", {"json": {}}),
        ("POST", p + "/runs/get", {"json": {"run_name": s.run}}),
        ("POST", p + "/runs/get_plan", {"json": {"run_spec": {"configuration": task}}}),
        (
            "POST",
            p + "/runs/apply",
            {"json": {"plan": {"run_spec": {"configuration": {"type": "task"}}}, "force": False}},
        ),
        ("POST", p + "/runs/stop", {"json": {"runs_names": ["no-such-run"]}}),
        ("POST", p + "/runs/delete", {"json": {"runs_names": ["no-such-run"]}}),
        ("POST", p + "/logs/poll", {"json": {"run_name": s.run, "job_submission_id": s.ids["job_submission_id"]}}),
        ("GET", p + "/metrics/job/{run_name}", {"run_name": s.run}),
        ("POST", p + "/gateways/get_plan", {"json": {"spec": {"configuration": gateway}}}),
        ("POST", p + "/gateways/apply", {"json": {"plan": {"spec": {"configuration": gateway}}}}),
        ("POST", p + "/gateways/list", {}),
        ("POST", p + "/gateways/get", {"json": {"name": "g"}}),
        ("POST", p + "/gateways/delete", {"json": {"names": ["g"]}}),
        ("POST", p + "/gateways/create", {"json": {"configuration": gateway}}),
        ("POST", p + "/gateways/set_default", {"json": {"name": "g"}}),
        ("POST", p + "/gateways/set_wildcard_domain", {"json": {"name": "g", "wildcard_domain": "a.test"}}),
        ("POST", p + "/volumes/create", {"json": {"configuration": volume}}),
        ("POST", p + "/volumes/list", {}),
        ("POST", "/api/volumes/list", {"json": {}}),
        ("POST", p + "/volumes/get", {"json": {"name": "v"}}),
        ("POST", p + "/volumes/delete", {"json": {"names": ["v"]}}),
        ("POST", "/api/events/list", {"json": {}}),
        ("POST", p + "/secrets/create_or_update", {"json": {"name": "fuzz-secret", "value": "s3cret"}}),
        ("POST", p + "/backends/create", {"json": {"type": "aws", "creds": {"type": "default"}, "regions": ["r"]}}),
        ("POST", p + "/backends/update", {"json": {"type": "aws", "creds": {"type": "default"}}}),
        ("POST", p + "/backends/delete", {"json": {"backends_names": ["aws"]}}),
        ("POST", p + "/backends/{backend_name}/config_info", {"backend_name": "aws"}),
        ("POST", p + "/backends/create_yaml", {"json": {"config_yaml": "type: aws\nregions: 3"}}),
        ("POST", p + "/backends/update_yaml", {"json": {"config_yaml": "[unclosed"}}),
        ("POST", p + "/backends/{backend_name}/get_yaml", {"backend_name": "aws"}),
        ("POST", p + "/secrets/list", {}),
        ("POST", p + "/secrets/get", {"json": {"name": "fuzz-secret"}}),
        ("POST", p + "/secrets/delete", {"json": {"secrets_names": ["fuzz-secret"]}}),
        ("POST", p + "/gpus/list", {"json": {"run_spec": {"configuration": task}}}),
        ("POST", p + "/templates/list", {}),
        ("POST", "/api/auth/list_providers", {}),
        ("POST", "/api/auth/get_next_redirect", {"json": {"code": "c", "state": _state(51234)}}),
        ("POST", "/api/auth/get_next_redirect", {"json": {"code": "c", "state": _state(None)}}),
        (
            "POST",
            p + "/exports/create",
            {"json": {"name": "fuzz-export-2", "exported_fleets": [s.fleet]}},
        ),
        ("POST", p + "/exports/update", {"json": {"name": s.export, "set_global": False}}),
        ("POST", p + "/exports/list", {}),
        ("POST", p + "/exports/delete", {"json": {"name": "fuzz-export-2"}}),
        ("POST", p + "/imports/list", {"project": s.other_project}),
        (
            "POST",
            p + "/imports/delete",
            {"json": {"export_name": "no-such-export", "export_project_name": s.project}, "project": s.other_project},
        ),
        ("POST", p + "/repos/init", {"json": {"repo_id": s.repo, "repo_info": {"repo_type": "virtual"}}}),
        ("POST", p + "/repos/list", {}),
        ("POST", p + "/repos/get", {"json": {"repo_id": s.repo, "include_creds": True}}),
        ("POST", p + "/repos/delete", {"json": {"repos_ids": ["no-such-repo"]}}),
        (
            "POST",
            p + "/repos/upload_code",
            {"params": {"repo_id": s.repo}, "files": {"file": (digest, b"an archive")}},
        ),
        ("POST", "/api/files/upload_archive", {"files": {"file": (digest, archive)}}),
        ("POST", "/api/files/get_archive_by_hash", {"json": {"hash": digest}}),
        ("POST", "/api/projects/{project_name}/quotas/get", {}),
        ("POST", "/api/projects/{project_name}/quotas/usage", {}),
        (
            "POST",
            "/api/projects/{project_name}/quotas/set",
            {"json": {"weight": 2, "quota": {"max": {"cpu": 64, "gpu": {"H100": 8, "any": 16}}}}},
        ),
        ("POST", "/api/scheduling/queue", {}),
    ]


def test_every_route_answers_real_data_as_its_document_says(seeded: Seeded, api: Any) -> None:
    calls = _calls(seeded)
    served = {(spec.method, spec.path) for table in TABLES for spec in table.routes}
    assert served - {(m, path) for m, path, _ in calls} == set(), "routes without a call here"
    problems = []
    seen: dict[str, set[int]] = {}
    with seeded.client() as c:
        for method, template, req in calls:
            req = dict(req)
            url = template.replace("{project_name}", req.pop("project", seeded.project))
            url = url.replace("{run_name}", req.pop("run_name", ""))
            url = url.replace("{backend_name}", req.pop("backend_name", ""))
            r = c.request(method, url, **req)
            r.request.read()  # a multipart body was streamed: the checks read it again
            seen.setdefault(f"{method} {template}", set()).add(r.status_code)
            op = _operation(api, method, template)
            documented = set(op.definition.raw["responses"])
            if str(r.status_code) not in documented:
                problems.append(f"{method} {url}: {r.status_code} is not documented ({sorted(documented)}): {r.text}")
                continue
            try:
                op.validate_response(r)
            except Exception as e:
                problems.append(f"{method} {url}: {r.status_code} does not match the document: {e}\n{r.text[:500]}")
    assert not problems, "\n".join(problems)
    # the calls reach past "not found": most routes answer 200 with real data
    ok = [k for k, codes in seen.items() if 200 in codes]
    assert len(ok) >= 55, seen


def _deep(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def _findings(s: Seeded) -> list[tuple[str, str, int, str]]:
    """(path, raw body, status, text in the answer): requests that answered 500 before."""
    p = f"/api/project/{s.project}"
    job = {"run_name": s.run, "job_submission_id": s.ids["job_submission_id"]}
    year1, year9999 = "0001-01-01T00:00:00", "9999-12-31T23:59:59-05:00"
    return [
        (p + "/logs/poll", json.dumps({**job, "next_token": "abc"}), 400, "Invalid next_token: abc"),
        (p + "/logs/poll", json.dumps({**job, "next_token": str(2**70)}), 400, "Must be a non-negative integer"),
        (p + "/logs/poll", json.dumps({**job, "next_token": "-1"}), 400, "Must be a non-negative integer"),
        # year 1 without a time zone (read as UTC); moved out of the calendar by its offset: a 422 naming it
        (p + "/logs/poll", json.dumps({**job, "start_time": year1}), 200, ""),
        (
            p + "/logs/poll",
            json.dumps({**job, "start_time": year1 + "+05:00", "end_time": year9999}),
            422,
            "start_time",
        ),
        ("/api/fleets/list", json.dumps({"prev_created_at": year1}), 200, ""),
        ("/api/runs/list", json.dumps({"prev_submitted_at": year1}), 200, ""),
        # a body nested 1,000 deep inside a configuration: its validation errors are shown without the input
        (p + "/runs/get_plan", f'{{"run_spec": {{"configuration": {_deep(1000)}}}}}', 422, "configuration"),
        (
            p + "/fleets/get_plan",
            f'{{"spec": {{"profile": {{}}, "configuration": {_deep(1000)}}}}}',
            422,
            "configuration",
        ),
        ("/api/users/list", f'{{"name_pattern": {_deep(1000)}}}', 422, "name_pattern"),
    ]


def test_what_the_fuzzing_found_is_a_client_error(seeded: Seeded) -> None:
    wrong = []
    with seeded.client() as c:
        for path, body, status, text in _findings(seeded):
            r = c.post(path, content=body.encode(), headers={"Content-Type": "application/json"})
            if r.status_code != status or text not in r.text:
                wrong.append(f"{path} {body[:100]}: {r.status_code} {r.text[:200]}")
    assert not wrong, "\n".join(wrong)


def _fuzz_one(
    seeded: Seeded, strategy: Any, examples: int, label: str, failures: list[str], counts: dict[str, int]
) -> None:
    """Run ``examples`` cases of ``strategy`` against the server, noting every failed check."""
    headers = {"Authorization": f"Bearer {seeded.token}"}
    session = requests.Session()

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def fuzz(case: Any) -> None:
        counts[label] = counts.get(label, 0) + 1
        response = case.call(base_url=seeded.url, headers=headers, session=session, timeout=30)
        try:
            case.validate_response(response, checks=CHECKS)
        except (AssertionError, FailureGroup) as e:
            lines = str(e).strip().splitlines()
            failures.append(f"{label}: {lines[0] if lines else repr(e)}\n    {case.as_curl_command()}")

    try:
        with session:
            fuzz()
    except Unsatisfiable:
        if "(negative)" not in label:
            raise
        # nothing of this route can be made invalid (no parameters, no body, or a body that takes anything)


def test_fuzzing_every_route_finds_no_server_error_and_no_undocumented_answer(seeded: Seeded, api: Any) -> None:
    failures: list[str] = []
    counts: dict[str, int] = {}
    started = time.monotonic()
    operations = [result.ok() for result in api.get_all_operations()]
    served = {(spec.method, spec.path) for table in TABLES for spec in table.routes}
    assert {(op.method.upper(), op.path) for op in operations} == served
    for op in operations:
        if (op.method.upper(), op.path) in NOT_FUZZED:
            continue
        fixed = {"project_name": seeded.project, "run_name": seeded.run}
        fixed = {k: v for k, v in fixed.items() if "{" + k + "}" in op.path}
        for mode, examples in FUZZ_EXAMPLES.items():
            strategy = op.as_strategy(generation_mode=mode, path_parameters=fixed or None)
            label = f"{op.method.upper()} {op.path} ({mode.value})"
            _fuzz_one(seeded, strategy, examples, label, failures, counts)
    elapsed = time.monotonic() - started
    assert not failures, f"{len(failures)} failures in {elapsed:.0f} s:\n" + "\n".join(dict.fromkeys(failures))
    positive = [label for label in counts if label.endswith("(positive)")]
    assert len(positive) == len(operations) - len(NOT_FUZZED)
    print(f"fuzzed {len(positive)} routes, {sum(counts.values())} requests in {elapsed:.0f} s")


#: Header names the server reads (or a client commonly sends), fuzzed with random values beside random names.
FUZZED_HEADERS = [
    "authorization",
    "x-api-version",
    "content-type",
    "cookie",
    "accept",
    "accept-encoding",
    "range",
    "if-none-match",
    "x-forwarded-for",
    "x-forwarded-proto",
    "origin",
    "upgrade",
    "user-agent",
]
#: RFC 9110 §5.6.2: a field name is a token
_TOKEN = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz"
#: RFC 9110 §5.5: visible ASCII, space and tab inside, and obs-text (0x80-0xff) in a field value
_VALUE = st.characters(codec="latin-1", exclude_characters="\r\n\x00", exclude_categories=["Cc"])
#: The routes whose headers are fuzzed: the API (with and without a project), the proxy, the UI, /metrics.
HEADER_ROUTES = [
    ("POST", "/api/runs/list", b"{}"),
    (
        "POST",
        "/api/project/main/runs/get_plan",
        b'{"run_spec": {"configuration": {"type": "task", "commands": ["true"]}}}',
    ),
    ("POST", "/api/project/main/logs/poll", b'{"run_name": "fuzz-run", "job_submission_id": "x"}'),
    ("GET", "/proxy/services/main/fuzz-run/", b""),
    ("GET", "/runs", b""),
    ("GET", "/metrics", b""),
    ("GET", "/healthcheck", b""),
]
HEADER_LIMIT = 8 * 1024  # the documented default of CORRAL_MAX_HEADER_BYTES (docs/security.md)


def test_fuzzing_the_headers_finds_no_server_error(seeded: Seeded) -> None:
    """Random header names and values (up to twice the limit) on each kind of route: never a 5xx, and a
    header over the limit is always a 431 that names it."""
    size = st.one_of(st.integers(0, 64), st.integers(HEADER_LIMIT - 64, 2 * HEADER_LIMIT - 600))
    value = size.flatmap(lambda n: st.text(_VALUE, min_size=n, max_size=n).map(str.strip))
    name = st.one_of(st.sampled_from(FUZZED_HEADERS), st.text(_TOKEN, min_size=1, max_size=40))
    wrong: list[str] = []
    with seeded.client() as c:

        @settings(
            max_examples=120, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
        )
        @given(route=st.sampled_from(HEADER_ROUTES), extra=st.dictionaries(name, value, min_size=1, max_size=3))
        def fuzz(route: tuple[str, str, bytes], extra: dict[str, str]) -> None:
            method, path, body = route
            # (values as latin-1 bytes: httpx encodes a str value as ASCII; its annotations want one type for all)
            headers: dict[str, Any] = {"content-type": "application/json"}
            headers.update((k, v.encode("latin-1")) for k, v in extra.items())
            r = c.request(method, path, content=body, headers=headers)
            over = [k for k, v in headers.items() if len(k) + len(v) > HEADER_LIMIT]
            if r.status_code >= 500 or (
                over and (r.status_code != 431 or repr(over[0]) not in r.json()["detail"][0]["msg"])
            ):
                wrong.append(
                    f"{method} {path} {[(k, len(v)) for k, v in extra.items()]}: {r.status_code} {r.text[:200]}"
                )

        fuzz()
    assert not wrong, "\n".join(dict.fromkeys(wrong))
