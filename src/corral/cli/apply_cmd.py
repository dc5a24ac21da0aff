"""``corral apply``: submit a run or create/update a fleet from a ``.dstack.yml``.

The file is validated locally with :func:`corral.config.load_configuration_file` and its raw
YAML mapping is what goes on the wire, as the ``configuration`` of a FleetSpec or RunSpec:

* fleet: ``fleets/get_plan`` -> show the plan -> confirm -> ``fleets/apply`` -> watch until the
  instances are provisioned;
* task/service/dev-environment: ``repos/init`` (the ``repos`` repo or ``--repo``, else the virtual
  repo) -> ``files/upload_archive`` per ``files:`` entry -> ``runs/get_plan`` -> show the plan ->
  confirm -> ``repos/upload_code`` (the diff or archive) -> ``runs/apply`` -> follow it (see
  :mod:`corral.cli.apply_run` and :mod:`corral.cli.repo_code`).
"""

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from corral.cli.common import ProjectOption, YesOption

JSON = dict[str, Any]
DEFAULT_FILES = (".dstack.yml", ".dstack.yaml")
RUN_TYPES = ("task", "service", "dev-environment")


def apply(  # noqa: C901
    file: Annotated[
        Optional[Path],
        typer.Option(
            "-f",
            "--file",
            help="The configuration file (default: .dstack.yml or .dstack.yaml in this directory).",
            metavar="FILE",
            show_default=False,
        ),
    ] = None,
    yes: YesOption = False,
    detach: Annotated[bool, typer.Option("-d", "--detach", help="Exit once submitted; do not follow the run.")] = False,
    force: Annotated[
        bool,
        typer.Option("--force", help="Apply even if nothing changed or the resource changed since the plan."),
    ] = False,
    name: Annotated[
        Optional[str],
        typer.Option("-n", "--name", help="The run or fleet name (overrides `name`).", metavar="NAME"),
    ] = None,
    env: Annotated[
        Optional[list[str]],
        typer.Option(
            "-e",
            "--env",
            help="An environment variable, KEY=VALUE or KEY; repeatable.",
            metavar="KEY[=VALUE]",
        ),
    ] = None,
    max_offers: Annotated[
        int, typer.Option("--max-offers", help="How many offers the run plan shows.", min=1, metavar="N")
    ] = 3,
    instance: Annotated[
        Optional[list[str]],
        typer.Option(
            "--instance",
            help="Run only on this existing instance (its name, e.g. my-fleet-0); repeatable. Adds to `instances`.",
            metavar="NAME",
        ),
    ] = None,
    repo: Annotated[
        Optional[str],
        typer.Option(
            "--repo", help="The repo of the run: a local path or a git URL (overrides `repos`).", metavar="REPO"
        ),
    ] = None,
    repo_branch: Annotated[
        Optional[str], typer.Option("--repo-branch", help="The branch of a --repo URL.", metavar="BRANCH")
    ] = None,
    repo_hash: Annotated[
        Optional[str], typer.Option("--repo-hash", help="The commit of a --repo URL.", metavar="HASH")
    ] = None,
    no_repo: Annotated[bool, typer.Option("--no-repo", help="Run without any repo (ignore `repos`).")] = False,
    token: Annotated[
        Optional[str],
        typer.Option("-t", "--token", help="An OAuth token to clone a private git repo.", metavar="OAUTH_TOKEN"),
    ] = None,
    git_identity: Annotated[
        Optional[str],
        typer.Option("--git-identity", help="A private SSH key to clone a private git repo.", metavar="KEY_FILE"),
    ] = None,
    max_price: Annotated[
        Optional[float],
        typer.Option("--max-price", help="The most an instance may cost per hour (sets `max_price`).", metavar="PRICE"),
    ] = None,
    idle_duration: Annotated[
        Optional[str],
        typer.Option(
            "--idle-duration",
            help="How long the instances created for the run stay idle before they go, e.g. 1m, 1h or off "
            "(sets `idle_duration`).",
            metavar="DURATION",
        ),
    ] = None,
    retry_duration: Annotated[
        Optional[str],
        typer.Option(
            "--retry-duration", help="How long to retry the run, e.g. 10m (sets `retry.duration`).", metavar="DURATION"
        ),
    ] = None,
    project: ProjectOption = None,
    run_args: Annotated[
        Optional[list[str]],
        typer.Argument(
            help="Run arguments, given to `commands` as ${{ run.args }} (put them after --).",
            metavar="[-- RUN_ARGS...]",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Apply a configuration: submit a run, create or update a fleet or a gateway, or create a volume."""
    from corral.cli.errors import CLIError

    if name is not None:
        from corral.domain.names import resource_name_error

        bad = resource_name_error(name)
        if bad is not None:
            raise typer.BadParameter(bad, param_hint="'-n' / '--name'")
    path = _find_file(file)
    conf_type, raw = load_raw_configuration(path)
    if name:
        raw["name"] = name
    if env:
        raw["env"] = _merge_env(raw.get("env"), env)
    if raw.get("env") is not None:
        raw["env"] = resolve_env(raw["env"])
    if isinstance(raw.get("registry_auth"), dict):
        raw["registry_auth"] = resolve_env_references(raw["registry_auth"], raw.get("env"))
    if run_args and conf_type not in ("task", "service"):
        raise typer.BadParameter("run arguments (${{ run.args }}) apply to tasks and services")
    if conf_type in ("task", "service") and isinstance(raw.get("commands"), list):
        raw["commands"] = resolve_run_args(raw["commands"], run_args or [])
    raw.update(_profile_options(conf_type, max_price, idle_duration, retry_duration))
    if instance:
        if conf_type not in RUN_TYPES:
            raise typer.BadParameter("--instance applies to runs (task, service, dev-environment), not fleets")
        raw["instances"] = [*(raw.get("instances") or []), *instance]
    configuration_path = str(file) if file is not None else path.name

    from corral.cli.common import client_for

    client, project_name = client_for(project)
    with client:
        if conf_type == "fleet":
            apply_fleet(client, project_name, raw, configuration_path, yes, detach, force)
        elif conf_type in RUN_TYPES:
            from corral.cli.apply_run import apply_run
            from corral.cli.repo_code import RepoOptions

            repo_options = RepoOptions(repo, repo_branch, repo_hash, no_repo, token, git_identity)
            code = apply_run(
                client, project_name, raw, configuration_path, yes, detach, force, max_offers, repo_options
            )
            if code:
                raise typer.Exit(code)
        elif conf_type in ("volume", "gateway"):
            code = _apply_resource(conf_type, client, project_name, raw, configuration_path, yes, detach, force)
            if code:
                raise typer.Exit(code)
        else:
            raise CLIError(f"`corral apply` does not support configurations of type {conf_type} yet")


def _apply_resource(
    conf_type: str, client: Any, project: str, raw: JSON, path: str, yes: bool, detach: bool, force: bool
) -> int:
    """``apply`` of a volume or a gateway; the exit code."""
    if conf_type == "volume":
        from corral.cli.apply_volume import apply_volume

        return apply_volume(client, project, raw, path, yes, detach, force)
    from corral.cli.apply_gateway import apply_gateway

    return apply_gateway(client, project, raw, path, yes, detach, force)


def _profile_options(
    conf_type: str, max_price: Optional[float], idle_duration: Optional[str], retry_duration: Optional[str]
) -> JSON:
    """What ``--max-price``, ``--idle-duration`` and ``--retry-duration`` set in the configuration, as dstack's
    ``apply`` sets them (``--retry-duration`` replaces ``retry`` with one of that duration)."""
    from corral.domain.durations import parse_duration, parse_idle_duration

    given = {"--max-price": max_price, "--idle-duration": idle_duration, "--retry-duration": retry_duration}
    used = [k for k, v in given.items() if v is not None]
    if used and conf_type not in (*RUN_TYPES, "fleet"):
        raise typer.BadParameter(f"{', '.join(used)} apply to runs and fleets, not to a {conf_type}")
    out: JSON = {}
    if max_price is not None:
        if max_price <= 0:
            raise typer.BadParameter(f"{max_price:g}: give a price above 0", param_hint="'--max-price'")
        out["max_price"] = max_price
    try:
        if idle_duration is not None:
            out["idle_duration"] = parse_idle_duration(idle_duration)
        if retry_duration is not None:
            out["retry"] = {"duration": parse_duration(retry_duration)}
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="'--idle-duration' / '--retry-duration'") from None
    return out


def _find_file(file: Optional[Path]) -> Path:
    from corral.cli.errors import CLIError

    if file is not None:
        if not file.is_file():
            raise CLIError(f"Configuration file {file} does not exist")
        return file
    for candidate in DEFAULT_FILES:
        path = Path.cwd() / candidate
        if path.is_file():
            return path
    raise CLIError(f"No .dstack.yml in {Path.cwd()}; pass a configuration file with -f FILE")


def load_raw_configuration(path: Path) -> tuple[str, JSON]:
    """Validate ``path`` with corral's configuration models; return its type and raw mapping."""
    import yaml

    from corral.cli.errors import CLIError
    from corral.config import ConfigError, load_configuration_file

    try:
        conf = load_configuration_file(path)
    except ConfigError as e:
        problems = [str(p) for p in getattr(e, "problems", None) or str(e).splitlines()]
        message = "; ".join(problems)
        raise CLIError(message if str(path) in message else f"{path}: {message}") from e
    raw = yaml.safe_load(path.read_text())
    return str(getattr(conf, "type", raw.get("type"))), raw


def _merge_env(current: Any, extra: list[str]) -> JSON:
    env: JSON = {}
    if isinstance(current, dict):
        env.update(current)
    elif isinstance(current, list):
        for item in current:
            key, sep, value = str(item).partition("=")
            env[key] = value if sep else None
    for item in extra:
        key, sep, value = item.partition("=")
        env[key] = value if sep else None
    return env


def resolve_env(env: Any) -> Any:
    """Fill variables listed without a value (``- HF_TOKEN``) from this process's environment."""
    import os

    from corral.cli.errors import CLIError

    def value_of(key: str) -> str:
        if key not in os.environ:
            raise CLIError(f"Environment variable {key} is not set")
        return os.environ[key]

    if isinstance(env, list):
        return [item if "=" in str(item) else f"{item}={value_of(str(item))}" for item in env]
    if isinstance(env, dict):
        return {k: value_of(k) if v is None else v for k, v in env.items()}
    return env


def resolve_env_references(auth: JSON, env: Any) -> JSON:
    """``${{ env.NAME }}`` in ``registry_auth`` filled in from the configuration's ``env``, as dstack's CLI
    does (``${{ secrets.NAME }}`` is left for the server, which fills it in when the job is sent)."""
    from corral.cli.errors import CLIError
    from corral.domain.interpolation import InterpolationError, interpolate

    values = {str(k): str(v) for k, v in _merge_env(env, []).items() if v is not None}
    out = dict(auth)
    for key in ("username", "password"):
        if isinstance(out.get(key), str) and "${{" in out[key]:
            try:
                out[key] = interpolate(out[key], {"env": values}, keep=("secrets",))
            except InterpolationError as e:
                raise CLIError(f"registry_auth.{key}: {e}") from None
    return out


def resolve_run_args(commands: list[Any], args: list[str]) -> list[Any]:
    """``${{ run.args }}`` in ``commands`` replaced by the run arguments (shell-quoted), as dstack's CLI does;
    ``secrets`` and ``groups[i].nodes[j].IP_ADDRESS`` references are left as they are, anything else is an
    error naming the command."""
    import shlex

    from corral.cli.errors import CLIError
    from corral.domain.interpolation import InterpolationError, interpolate, valid_groups_ref, valid_name

    keep = {"secrets": valid_name, "groups": valid_groups_ref}
    out = []
    for n, command in enumerate(commands):
        if isinstance(command, str) and "$" in command:
            try:
                command = interpolate(command, {"run": {"args": shlex.join(args)}}, keep, again=False)
            except InterpolationError as e:
                raise CLIError(f"commands[{n}]: {e}") from None
        out.append(command)
    return out


# ---- fleets -------------------------------------------------------------------------------


def apply_fleet(  # noqa: PLR0915
    client: Any, project: str, raw: JSON, configuration_path: str, yes: bool, detach: bool, force: bool
) -> None:
    """Plan, confirm and apply a fleet configuration, then watch it provision."""
    from corral.cli import render
    from corral.cli.errors import CLIError
    from corral.sdk.errors import ClientError, ResourceNotExistsError

    _resolve_ssh_keys(raw)
    spec: JSON = {
        "configuration": raw,
        "configuration_path": configuration_path,
        "profile": {"name": "default"},
    }
    out = render.console()
    with out.status("Getting apply plan..."):
        plan = client.fleets_get_plan(project, spec)
    print_fleet_plan(plan)

    current = plan.get("current_resource")
    fleet_name = raw.get("name") or (plan.get("spec") or {}).get("configuration", {}).get("name")
    delete_first = False
    if current is None:
        if fleet_name:
            out.print(f"Fleet [code]{fleet_name}[/] does not exist yet.")
        question = "Create the fleet?"
    else:
        effective = plan.get("effective_spec") or plan.get("spec") or {}
        same = _same_spec(current.get("spec") or {}, effective)
        message = f"Found fleet [code]{current.get('name')}[/]."
        if same:
            if yes and not force:
                out.print("No configuration changes detected. Use --force to apply anyway.")
                return
            message += " No configuration changes detected."
            question, delete_first = "Re-create the fleet?", True
        elif plan.get("action") == "update":
            message += " Configuration changes detected."
            question = "Update the fleet in-place?"
        else:
            message += " Configuration changes detected. Cannot update the fleet in-place."
            question, delete_first = "Re-create the fleet?", True
        out.print(message)
    if not yes and not render.confirm(question):
        out.print("\nExiting...")
        return
    if delete_first and current is not None:
        import time

        with out.status("Deleting existing fleet..."):
            client.fleets_delete(project, [current["name"]])
            while True:
                try:
                    client.fleets_get(project, current["name"])
                except ResourceNotExistsError:
                    break
                time.sleep(1)
        current = None
    try:
        with out.status("Applying plan..."):
            fleet = client.fleets_apply(project, {"spec": spec, "current_resource": current}, force)
    except ClientError as e:
        raise CLIError(str(e))
    if detach:
        out.print("Fleet configuration submitted. Exiting...")
        return
    _watch_fleet(client, project, fleet)


def _watch_fleet(client: Any, project: str, fleet: JSON) -> None:
    import time

    from rich.live import Live

    from corral.cli import render
    from corral.cli.errors import CLIError

    out = render.console()
    try:
        with Live(console=out, refresh_per_second=1, transient=True) as live:
            while any(
                i.get("status") in ("pending", "provisioning", "terminating") for i in fleet.get("instances") or []
            ):
                live.update(render.fleets_table([fleet], project))
                time.sleep(1)
                fleet = client.fleets_get(project, fleet["name"])
    except KeyboardInterrupt:
        out.print("Exiting... Fleet provisioning will continue in the background.")
        return
    failed = any(i.get("status") == "terminated" for i in fleet.get("instances") or [])
    out.print(render.fleets_table([fleet], project, verbose=failed))
    if failed:
        raise CLIError("Some instances failed. Check the table above for errors.")


def _same_spec(current: JSON, effective: JSON) -> bool:
    def norm(spec: JSON) -> JSON:
        return {k: v for k, v in spec.items() if k not in ("merged_profile", "autocreated", "configuration_path")}

    return norm(current) == norm(effective)


def print_fleet_plan(plan: JSON) -> None:
    """Project, User, Configuration, Type, Fleet type, Nodes, ... then up to 3 offers."""
    from corral.cli import formatting as f
    from corral.cli import render

    spec = plan.get("effective_spec") or plan.get("spec") or {}
    conf = spec.get("configuration") or {}
    rows = [
        ("Project", str(plan.get("project_name") or "")),
        ("User", str(plan.get("user") or "")),
        ("Configuration", str(spec.get("configuration_path") or "?")),
        ("Type", str(conf.get("type") or "fleet")),
    ]
    ssh = conf.get("ssh_config")
    spot_policy = f.merged_profile(spec, fleet=True).get("spot_policy")
    if ssh is not None:
        rows += [("Fleet type", "ssh"), ("Nodes", str(len(ssh.get("hosts") or [])))]
        spot_policy = None
    else:
        rows += [("Fleet type", "cloud"), ("Nodes", f.format_nodes_spec(conf.get("nodes")))]
    rows.append(("Placement", str(conf.get("placement") or "any")))
    if conf.get("backends") is not None:
        rows.append(("Backends", ", ".join(map(str, conf["backends"]))))
    if conf.get("regions") is not None:
        rows.append(("Regions", ", ".join(map(str, conf["regions"]))))
    if ssh is None and conf.get("resources") is not None:
        rows.append(("Resources", f.format_resources_spec(conf["resources"])))
    if spot_policy is not None:
        rows.append(("Spot policy", str(spot_policy)))
    if conf.get("reservation") is not None:
        rows.append(("Reservation", str(conf["reservation"])))
    out = render.console()
    out.print(render.props_table(rows))
    out.print()
    offers = plan.get("offers") or []
    if offers:
        out.print(render.offers_table(offers[:3], len(offers)))
        if len(offers) > 3:
            out.print(
                f"[secondary] Shown 3 of {plan.get('total_offers', len(offers))} offers, "
                f"{f.format_max_price(plan.get('max_offer_price'))} max[/]"
            )
        out.print()
    elif ssh is None:
        out.print(render.NO_FLEET_OFFERS_WARNING)


def _resolve_ssh_keys(raw: JSON) -> None:
    """Put the contents of each ``identity_file`` in ``ssh_key`` (as dstack's CLI does), so the
    server never reads files on the client's machine."""
    ssh = raw.get("ssh_config")
    if not isinstance(ssh, dict):
        return
    targets = [ssh, ssh.get("proxy_jump")]
    for host in ssh.get("hosts") or []:
        if isinstance(host, dict):
            targets += [host, host.get("proxy_jump")]
    for target in targets:
        if isinstance(target, dict) and target.get("identity_file") and not target.get("ssh_key"):
            target["ssh_key"] = _read_ssh_key(str(target["identity_file"]))


def _read_ssh_key(path_text: str) -> JSON:
    import subprocess

    from corral.cli.errors import CLIError

    path = Path(path_text).expanduser()
    try:
        private = path.read_text()
    except OSError as e:
        raise CLIError(f"Unable to read the SSH key at {path_text}: {e.strerror or e}")
    if "PRIVATE KEY" not in private:
        raise CLIError(f"Expected a private key at {path_text}")
    pub_path = path.with_name(path.name + ".pub")
    public = ""
    if pub_path.is_file():
        public = pub_path.read_text().strip()
    else:
        try:
            result = subprocess.run(
                ["ssh-keygen", "-y", "-f", str(path)], capture_output=True, text=True, timeout=10, check=False
            )
            public = result.stdout.strip() if result.returncode == 0 else ""
        except (OSError, subprocess.SubprocessError):
            public = ""
    return {"public": public, "private": private}
