"""The one ``Settings`` object, built once at start-up and passed down.

Nothing here reads the environment at import time: ``Settings.from_env()`` is called by the
entry point (``corral server``) or by tests, which may also construct ``Settings`` directly with
short timeouts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path


def _float_env(env: dict[str, str], name: str, default: float | None) -> float | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("off", "none", "unlimited"):
        return None
    try:
        return float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number of seconds (or 'off')") from None


#: The longest admin token accepted: sealed (``store/encryption.py``) it must fit the 200-character column.
MAX_ADMIN_TOKEN = 100
#: Let's Encrypt's production ACME directory (https://letsencrypt.org/docs/client-options/, "ACME v2 endpoint").
LETS_ENCRYPT_DIRECTORY = "https://acme-v02.api.letsencrypt.org/directory"
#: gpuhunt's public catalogue bucket, catalogue v3 (gpuhunt ``_internal/catalog.py``: ``CATALOG_URL``).
GPUHUNT_CATALOG_URL = "https://dstack-gpu-pricing.s3.eu-west-1.amazonaws.com/v3"


class SettingsError(ValueError):
    """A setting from the environment that cannot be used."""


@dataclass(frozen=True)
class Settings:
    server_dir: Path
    database_url: str
    host: str = "127.0.0.1"
    port: int = 3000
    admin_token: str | None = None
    log_level: str = "info"
    #: How log lines look: ``text`` or ``json`` (one object a line).
    log_format: str = "text"
    #: Whether the server logs one line per HTTP request (method, path, status, duration).
    access_log: bool = False
    #: Seconds between safety-net passes of each worker (work normally starts on wake-ups).
    safety_net_interval: float = 5.0
    #: How long the agent of a new local instance may take to answer.
    provisioning_timeout: float = 60.0
    #: How long the agent of an SSH host or a cloud instance may stay unreachable before its jobs fail
    #: ``instance_unreachable`` (and a cloud instance is terminated and replaced): brief network loss is normal
    #: there (docs/runs/lost-hosts.md argues the default).
    agent_unreachable_timeout: float = 120.0
    #: The same for a local instance, whose agent is a process of this machine: no network to lose, so one that
    #: stops answering was killed or hangs.
    local_agent_unreachable_timeout: float = 10.0
    #: How long one SSH handshake with a fleet host may take (a slow host is retried, not given up on).
    ssh_connect_timeout: float = 20.0
    #: Seconds between health checks of every instance's agent (two failures in a row flag it unreachable).
    instance_check_interval: float = 10.0
    #: How long a replica's claim on a job lasts without a heartbeat (another replica takes over after it).
    job_lease_ttl: float = 30.0
    #: Timeout of one call to an agent.
    agent_request_timeout: float = 5.0
    #: Long-poll window for logs/status from an agent.
    agent_poll_wait: float = 10.0
    #: Default graceful stop window (dstack's ``stop_duration`` default is 5 minutes).
    default_stop_duration: float = 300.0
    #: Upper bound on how long a job may wait in the queue (None = unlimited).
    max_queue_wait: float | None = None
    #: After waiting this long, a job holds the fleets it can use so smaller jobs cannot starve it.
    starvation_guard: float | None = 300.0
    #: Maximum number of local instances (default: the CPU count).
    local_max_instances: int = field(default_factory=lambda: os.cpu_count() or 1)
    #: CPUs and memory (MiB) of this machine the local backend divides among its instances (None: what the
    #: machine has; more than it has oversubscribes it).
    local_cpus: int | None = None
    local_memory_mib: int | None = None
    #: Blocks the machine is split into for local instances (None: ``auto``, one per GPU, else one per CPU).
    local_blocks: int | None = None
    #: Default idle duration of fleet instances (dstack: 3 days).
    default_fleet_idle_duration: float = 3 * 24 * 3600.0
    #: Where local instances keep their work directories (replicas on one machine share it).
    local_instances_dir: Path | None = None
    #: Whether to run the background workers (tests of the API alone may turn them off).
    background_processing: bool = True
    #: Whether ``corral server`` writes the ``main`` project into the CLI's config on first start.
    write_cli_config: bool = True
    #: Whether the server serves the web UI at ``/`` (``CORRAL_UI=0`` turns it off: only the API is served).
    ui: bool = True
    #: Largest accepted ``repos/upload_code`` and ``files/upload_archive`` request, in bytes (dstack: 2 MiB).
    code_upload_limit: int = 2 * 2**20
    #: Largest JSON request body of most routes, in bytes: a longer one is a 413 before it is read further.
    request_body_limit: int = 2**20
    #: Largest JSON body of the routes that carry a configuration (runs' and fleets' ``get_plan`` and
    #: ``apply``, gateways, volumes), in bytes.
    spec_body_limit: int = 8 * 2**20
    #: The deepest nesting of objects and arrays in a request body.
    max_json_depth: int = 64
    #: The most items in one array, or keys in one object, of a request body.
    max_list_length: int = 10_000
    #: The longest string (or object key) in a request body, in characters.
    max_string_length: int = 256 * 1024
    #: The longest request header (its name and value), in bytes: a longer one is a 431.
    max_header_bytes: int = 8 * 1024
    #: The most ``nodes`` a task or a fleet may have.
    max_nodes: int = 1000
    #: The most ``replicas`` a service may have (all its replica groups together).
    max_replicas: int = 1000
    #: Key that encrypts tokens, private keys and credentials at rest (base64 of 32 bytes); None = a key file.
    encryption_key: str | None = None
    #: The key file when ``encryption_key`` is None (made on first use, mode 0600); None = in the state dir
    #: (:attr:`encryption_key_file`).
    encryption_key_path: Path | None = None
    #: Image for jobs whose configuration sets none (None: such jobs run as host processes).
    default_image: str | None = None
    #: The image ``docker: true`` jobs run in (dstack 0.22.5's ``DSTACK_DIND_IMAGE``, default ``dstackai/dind``).
    dind_image: str = "dstackai/dind"
    #: Whether runs may set ``docker: true``: its privileged container is not isolated from its host.
    allow_docker_in_docker: bool = True
    #: The Docker engine local agents use for jobs with an image (None: ``DOCKER_HOST`` or the default socket).
    docker_host: str | None = None
    #: Host-process jobs of local agents in a sandbox: ``auto`` (when the server runs as root), ``on``, ``off``.
    sandbox: str = "auto"
    #: The uids sandboxed jobs get, one each (``first-last``; None: 200000-265535).
    job_uid_range: str | None = None
    #: How long events are kept, in seconds (dstack: 30 days); at most zero stores none.
    events_ttl: float = 30 * 24 * 3600.0
    #: The SSH endpoint of jobs (``dstack attach``, ``ssh <run>``): its port (0: a free one, chosen when the
    #: first job runs), the address it binds (None: ``host``) and the host name the CLI is told to reach
    #: (None: the bound address, ``127.0.0.1`` for a wildcard).
    ssh_port: int = 0
    ssh_host: str | None = None
    ssh_hostname: str | None = None
    #: Where dev environments download their IDE's server when ``version`` is set (the vendor's paths under
    #: it; None: each vendor's own address).
    ide_download_url: str | None = None
    #: Failed probes in a row (or connection errors the proxy sees) that take a service replica out of traffic.
    probe_failure_threshold: int = 3
    #: How often the probes of service replicas are looked at (each probe runs at its own ``interval``).
    probe_tick: float = 0.5
    #: Largest request body the in-server proxy forwards to a service (dstack's gateway: 64 MiB).
    proxy_body_limit: int = 64 * 2**20
    #: How long the proxy waits for a replica's response head (dstack: ``DSTACK_SERVICE_CLIENT_TIMEOUT``).
    proxy_timeout: float = 300.0
    #: How long at most a service replica leaving rotation (rollout, scale-down) keeps its in-flight
    #: requests before it is stopped; it stops earlier once none is left (``CORRAL_SERVICE_DRAIN_TIMEOUT``).
    service_drain_timeout: float = 30.0
    #: Requests held per service while it scales from zero, and for how long at most, before a 503 with
    #: ``Retry-After`` (``CORRAL_PROXY_COLD_START_QUEUE``, ``CORRAL_PROXY_COLD_START_TIMEOUT``).
    proxy_cold_start_queue: int = 100
    proxy_cold_start_timeout: float = 300.0
    #: How often service replica counts are reconciled (rollouts, autoscaling; also when woken).
    service_scaling_tick: float = 1.0
    #: The RPS window every autoscaled service is measured over, in seconds, instead of its ``scaling.window``
    #: (None: the service's own; for demos and tests, ``CORRAL_SERVICE_SCALING_WINDOW``).
    service_scaling_window: float | None = None
    #: A newer AWS price catalogue (gpuhunt's v2 CSV format) than the one shipped; None: the shipped one.
    aws_catalog: Path | None = None
    #: The base URL of gpuhunt's published catalogues (``<url>/aws/version``, ``<url>/aws/<v>/catalog.zip``),
    #: fetched at most daily into the state directory and used instead of the shipped snapshot (unless
    #: ``aws_catalog`` names a file); None: never fetched. ``CORRAL_AWS_LIVE_CATALOG`` (``off``; default:
    #: gpuhunt's bucket).
    aws_live_catalog: str | None = None
    #: How old (by EC2's ``LaunchTime``) an instance tagged with this server's id, whose row is missing or
    #: terminal, must be before the reaper acts on it. An orphan is gone within ``orphan_grace +
    #: orphan_interval`` (90 s by default) of its launch. Why 60 s is enough, race by race: the instance's row
    #: is committed before RunInstances is called, and the reaper reads the rows after EC2 listed the
    #: instances, so a launch in flight -- on this replica or another sharing the database -- always has its
    #: row when it is looked at (no grace is needed for it); a row is marked terminated only once
    #: DescribeInstances said so. What is left is the clock: ``LaunchTime`` is EC2's, ``now`` this server's,
    #: and 60 s covers any skew of an NTP-synchronised host many times over (a host whose clock is off by
    #: more than that reaps true orphans that much sooner or later, never a live row's instance).
    orphan_grace: float = 60.0
    #: What the reaper does with such an orphan: ``terminate`` it, or only ``report`` it (a log line).
    orphan_action: str = "terminate"
    #: Seconds between two orphan passes over a cloud backend's regions (one DescribeInstances per project
    #: and region each).
    orphan_interval: float = 30.0
    #: Seconds an AWS offering (region, zone, type) that had no capacity, or a region whose quota was
    #: reached, is skipped by later launches.
    aws_unavailable_ttl: float = 120.0
    #: Seconds a submitted Slurm allocation may pend before it is cancelled and its run fails with Slurm's
    #: reason (``CORRAL_SLURM_MAX_PENDING``; 0: no limit). One Slurm says can never start is cancelled at once.
    slurm_max_pending: float = 1800.0
    #: Failed tries to terminate an instance (a cloud that does not confirm it) before it is reported stuck:
    #: an event, and its message says so. It keeps counting against ``nodes.max`` and is tried again.
    termination_stuck_tries: int = 3

    #: How long job metrics samples are kept, in seconds: those of running jobs (dstack's
    #: ``DSTACK_SERVER_METRICS_RUNNING_TTL_SECONDS``, 1 h) and of finished ones (``..._FINISHED_TTL_SECONDS``, 7 d).
    metrics_running_ttl: float = 3600.0
    metrics_finished_ttl: float = 7 * 24 * 3600.0
    #: Whether ``GET /metrics`` (Prometheus) answers (dstack's ``DSTACK_ENABLE_PROMETHEUS_METRICS``), and the
    #: bearer token it then requires (None: none).
    enable_prometheus_metrics: bool = False
    prometheus_auth_token: str | None = None
    #: The least ``utilization_policy.time_window`` a run may set, in seconds (None: dstack's 5 minutes). For
    #: checks only (``CORRAL_UTILIZATION_MIN_WINDOW``): a check that cannot wait five minutes for an idle GPU.
    utilization_min_window: float | None = None
    #: The free space the state directory keeps, in bytes (``CORRAL_MIN_FREE_DISK_MB``): below it new runs and
    #: the storing of jobs' output are refused until space returns (docs/disk-space.md argues the default).
    min_free_disk: int = 128 * 2**20
    #: The emergency reserve file kept in the state directory, in bytes (``CORRAL_DISK_RESERVE_MB``; 0: none),
    #: deleted to start on a full disk.
    disk_reserve: int = 4 * 2**20
    #: The most output stored per job, in bytes (``CORRAL_JOB_LOG_LIMIT_MB``; 0: no limit): past it the oldest is
    #: dropped, the newest kept (docs/disk-space.md argues the default).
    job_log_limit: int = 50 * 2**20
    #: The policy service that ``config.yml``'s ``plugins: [rest_plugin]`` calls on every apply
    #: (``CORRAL_PLUGIN_SERVICE_URI``, else dstack's ``DSTACK_PLUGIN_SERVICE_URI``; docs/policies.md).
    plugin_service_uri: str | None = None
    #: How long an apply waits for the policy service's answer, in seconds (``CORRAL_PLUGIN_REQUEST_TIMEOUT``;
    #: dstack 0.22.5's ``PLUGIN_REQUEST_TIMEOUT_SEC`` is 8, in ``dstack/plugins/builtin/rest_plugin/_plugin.py``).
    plugin_request_timeout: float = 8.0
    #: The ACME directory gateways' certificates come from (``CORRAL_ACME_SERVER``, else dstack's
    #: ``DSTACK_ACME_SERVER``; default Let's Encrypt's production directory; docs/gateways.md#certificates).
    acme_server: str = LETS_ENCRYPT_DIRECTORY
    #: External Account Binding credentials for that CA (``CORRAL_ACME_EAB_KID`` and ``CORRAL_ACME_EAB_HMAC_KEY``,
    #: else dstack's ``DSTACK_ACME_EAB_*``): both or neither.
    acme_eab_kid: str | None = None
    acme_eab_hmac_key: str | None = None
    #: The PEM file the ACME server's TLS is verified against (``CORRAL_ACME_CA_BUNDLE``; None: the system store).
    acme_ca_bundle: Path | None = None
    #: How often, in seconds, the server asks the ACME server whether it still knows the server's account while
    #: gateways hold its certificates (``CORRAL_ACME_ACCOUNT_CHECK_INTERVAL``; docs/gateways.md, "A CA that lost
    #: its state").
    acme_account_check_interval: float = 300.0
    #: The ports of this machine a gateway on a local fleet's instance listens on (``CORRAL_LOCAL_GATEWAY_HTTP_PORT``,
    #: ``CORRAL_LOCAL_GATEWAY_HTTPS_PORT``): 80 and 443, unless a forward from those reaches the gateway elsewhere
    #: (an ACME CA validates HTTP-01 on port 80 only: RFC 8555 §8.3; docs/gateways.md#a-gateway-on-a-local-fleet).
    local_gateway_http_port: int = 80
    local_gateway_https_port: int = 443

    def unreachable_timeout(self, backend: str) -> float:
        """How long an instance of ``backend`` may go without its agent answering before it is given up."""
        return self.local_agent_unreachable_timeout if backend == "local" else self.agent_unreachable_timeout

    @property
    def data_dir(self) -> Path:
        return self.server_dir / "data"

    @property
    def instances_dir(self) -> Path:
        return self.local_instances_dir or self.server_dir / "instances"

    @property
    def encryption_key_file(self) -> Path:
        """Where the key is kept when ``encryption_key`` is None: the file named by
        ``CORRAL_SERVER_ENCRYPTION_KEY_FILE``, else ``<state dir>/encryption.key``, outside ``data/`` (where
        the database is), so that a copy of the data directory does not carry the key that opens its
        secrets. A key an older corral made in ``data/`` stays in use until it is moved
        (:attr:`legacy_encryption_key_file`)."""
        if self.encryption_key_path is not None:
            return self.encryption_key_path
        default = self.server_dir / "encryption.key"
        legacy = self.legacy_encryption_key_file
        return legacy if not default.exists() and legacy.exists() else default

    @property
    def legacy_encryption_key_file(self) -> Path:
        """Where corral kept the key before 2026-12: beside the database."""
        return self.data_dir / "encryption.key"

    @staticmethod
    def from_env(env: dict[str, str] | None = None, **overrides: object) -> Settings:  # noqa: C901, PLR0915
        e = dict(os.environ if env is None else env)
        server_dir = Path(e.get("CORRAL_SERVER_DIR") or Path.home() / ".corral" / "server").expanduser()
        db = e.get("CORRAL_DATABASE_URL") or f"sqlite+aiosqlite:///{server_dir / 'data' / 'corral.db'}"
        s = Settings(
            server_dir=server_dir,
            database_url=db,
            admin_token=e.get("CORRAL_SERVER_ADMIN_TOKEN") or None,
            log_level=e.get("CORRAL_SERVER_LOG_LEVEL", "info"),
            log_format=(e.get("CORRAL_LOG_FORMAT") or "text").lower(),
            safety_net_interval=_float_env(e, "CORRAL_SAFETY_NET_INTERVAL", 5.0) or 5.0,
            provisioning_timeout=_float_env(e, "CORRAL_PROVISIONING_TIMEOUT", 60.0) or 60.0,
            job_lease_ttl=_float_env(e, "CORRAL_JOB_LEASE_TTL", 30.0) or 30.0,
            agent_poll_wait=_float_env(e, "CORRAL_AGENT_POLL_WAIT", 10.0) or 10.0,
            agent_unreachable_timeout=_float_env(e, "CORRAL_AGENT_UNREACHABLE_TIMEOUT", 120.0) or 120.0,
            local_agent_unreachable_timeout=_float_env(e, "CORRAL_LOCAL_AGENT_UNREACHABLE_TIMEOUT", 10.0) or 10.0,
            ssh_connect_timeout=_float_env(e, "CORRAL_SSH_CONNECT_TIMEOUT", 20.0) or 20.0,
            instance_check_interval=_float_env(e, "CORRAL_INSTANCE_CHECK_INTERVAL", 10.0) or 10.0,
            default_stop_duration=_float_env(e, "CORRAL_DEFAULT_STOP_DURATION", 300.0) or 300.0,
            max_queue_wait=_float_env(e, "CORRAL_MAX_QUEUE_WAIT", None),
            starvation_guard=_float_env(e, "CORRAL_STARVATION_GUARD", 300.0),
            background_processing=e.get("CORRAL_BACKGROUND_PROCESSING", "1") not in ("0", "false", "off"),
            ui=e.get("CORRAL_UI", "1").lower() not in ("0", "false", "off"),
            encryption_key=e.get("CORRAL_SERVER_ENCRYPTION_KEY") or None,
            default_image=e.get("CORRAL_DEFAULT_IMAGE") or None,
            docker_host=e.get("CORRAL_DOCKER_HOST") or None,
        )
        if s.admin_token is not None and len(s.admin_token) > MAX_ADMIN_TOKEN:
            raise SettingsError(
                f"CORRAL_SERVER_ADMIN_TOKEN is {len(s.admin_token)} characters long; at most {MAX_ADMIN_TOKEN} are "
                "accepted (tokens are stored encrypted, in dstack's column size)"
            )
        if e.get("CORRAL_SERVER_CODE_UPLOAD_LIMIT"):
            try:
                s = replace(s, code_upload_limit=int(e["CORRAL_SERVER_CODE_UPLOAD_LIMIT"]))
            except ValueError:
                raise SettingsError("CORRAL_SERVER_CODE_UPLOAD_LIMIT must be a number of bytes") from None
        if e.get("CORRAL_SSH_PORT"):
            raw = e["CORRAL_SSH_PORT"]
            if not raw.isdigit() or int(raw) > 65535:
                raise SettingsError("CORRAL_SSH_PORT must be a port number (0..65535; 0: a free one)")
            s = replace(s, ssh_port=int(raw))
        s = replace(
            s,
            ssh_host=e.get("CORRAL_SSH_HOST") or None,
            ssh_hostname=e.get("CORRAL_SSH_HOSTNAME") or None,
            ide_download_url=e.get("CORRAL_IDE_DOWNLOAD_URL") or None,
        )
        s = _input_limits(s, e)
        if e.get("CORRAL_SERVER_ENCRYPTION_KEY_FILE"):
            s = replace(s, encryption_key_path=Path(e["CORRAL_SERVER_ENCRYPTION_KEY_FILE"]).expanduser())
        if e.get("CORRAL_SANDBOX"):
            if e["CORRAL_SANDBOX"] not in ("auto", "on", "off"):
                raise SettingsError("CORRAL_SANDBOX must be auto, on or off")
            s = replace(s, sandbox=e["CORRAL_SANDBOX"])
        if e.get("CORRAL_JOB_UID_RANGE"):
            lo, _, hi = e["CORRAL_JOB_UID_RANGE"].partition("-")
            if not (lo.isdigit() and hi.isdigit() and 0 < int(lo) <= int(hi) < 2**32 - 1):
                raise SettingsError("CORRAL_JOB_UID_RANGE must be a range of uids like 200000-265535")
            s = replace(s, job_uid_range=e["CORRAL_JOB_UID_RANGE"])
        if e.get("CORRAL_SERVER_EVENTS_TTL_SECONDS"):
            raw = e["CORRAL_SERVER_EVENTS_TTL_SECONDS"]
            try:
                s = replace(s, events_ttl=float(raw))
            except ValueError:
                raise SettingsError(
                    f"CORRAL_SERVER_EVENTS_TTL_SECONDS={raw!r} is not a number of seconds (0 or less: keep no events)"
                ) from None
        if e.get("CORRAL_PROBE_FAILURE_THRESHOLD"):
            raw = e["CORRAL_PROBE_FAILURE_THRESHOLD"]
            if not raw.isdigit() or int(raw) < 1:
                raise SettingsError(f"CORRAL_PROBE_FAILURE_THRESHOLD={raw!r} must be a whole number of at least 1")
            s = replace(s, probe_failure_threshold=int(raw))
        if e.get("CORRAL_LOCAL_INSTANCES_DIR"):
            s = replace(s, local_instances_dir=Path(e["CORRAL_LOCAL_INSTANCES_DIR"]).expanduser())
        if "CORRAL_LOCAL_MAX_INSTANCES" in e:
            try:
                s = replace(s, local_max_instances=int(e["CORRAL_LOCAL_MAX_INSTANCES"]))
            except ValueError:
                raise SettingsError("CORRAL_LOCAL_MAX_INSTANCES must be an integer") from None
        s = _local_host(s, e)
        s = _docker_in_docker(s, e)
        s = _services(s, e)
        s = _metrics(s, e)
        s = _clouds(s, e)
        s = _disk(s, e)
        s = _plugins(s, e)
        s = _acme(s, e)
        s = _local_gateway(s, e)
        if overrides:
            s = replace(s, **overrides)  # type: ignore[arg-type]
        return s


#: The caps on request input (``docs/security.md``): environment variable -> setting.
INPUT_LIMITS = {
    "CORRAL_SERVER_REQUEST_BODY_LIMIT": "request_body_limit",
    "CORRAL_SERVER_SPEC_BODY_LIMIT": "spec_body_limit",
    "CORRAL_MAX_JSON_DEPTH": "max_json_depth",
    "CORRAL_MAX_LIST_LENGTH": "max_list_length",
    "CORRAL_MAX_STRING_LENGTH": "max_string_length",
    "CORRAL_MAX_HEADER_BYTES": "max_header_bytes",
    "CORRAL_MAX_NODES": "max_nodes",
    "CORRAL_MAX_REPLICAS": "max_replicas",
}


def _disk(s: Settings, e: dict[str, str]) -> Settings:
    """``CORRAL_MIN_FREE_DISK_MB`` (the free space the state directory keeps), ``CORRAL_DISK_RESERVE_MB`` (its
    emergency reserve) and ``CORRAL_JOB_LOG_LIMIT_MB`` (the output stored per job), in MiB."""
    return replace(
        s,
        min_free_disk=_mib_env(e, "CORRAL_MIN_FREE_DISK_MB", s.min_free_disk),
        disk_reserve=_mib_env(e, "CORRAL_DISK_RESERVE_MB", s.disk_reserve),
        job_log_limit=_mib_env(e, "CORRAL_JOB_LOG_LIMIT_MB", s.job_log_limit),
    )


def _plugins(s: Settings, e: dict[str, str]) -> Settings:
    """Where the policy service answers (corral's name or dstack's) and how long an apply waits for it."""
    var, uri = _either(e, "PLUGIN_SERVICE_URI")
    if uri is not None and not uri.startswith(("http://", "https://")):
        raise SettingsError(f"{var}={uri!r} must be an http:// or https:// URL, such as http://127.0.0.1:8000")
    raw = e.get("CORRAL_PLUGIN_REQUEST_TIMEOUT")
    timeout = _float_env(e, "CORRAL_PLUGIN_REQUEST_TIMEOUT", s.plugin_request_timeout)
    if timeout is None or not 0 < timeout <= 300:
        raise SettingsError(f"CORRAL_PLUGIN_REQUEST_TIMEOUT={raw!r} must be a number of seconds, above 0, 300 at most")
    return replace(s, plugin_service_uri=uri.rstrip("/") if uri else None, plugin_request_timeout=timeout)


def _mib_env(e: dict[str, str], name: str, default: int) -> int:
    raw = e.get(name)
    if not raw:
        return default
    if not raw.isdigit():
        raise SettingsError(f"{name}={raw!r} must be a whole number of MiB (0: none)")
    return int(raw) * 2**20


def _input_limits(s: Settings, e: dict[str, str]) -> Settings:
    for var, attr in INPUT_LIMITS.items():
        raw = e.get(var)
        if raw:
            if not raw.isdigit() or int(raw) < 1:
                raise SettingsError(f"{var}={raw!r} must be a whole number of at least 1")
            s = replace(s, **{attr: int(raw)})  # type: ignore[arg-type]
    return s


def _services(s: Settings, e: dict[str, str]) -> Settings:
    """The service knobs the YAML cannot carry: drain, cold start, the scaling tick and window."""
    for var, attr, least in (
        ("CORRAL_SERVICE_DRAIN_TIMEOUT", "service_drain_timeout", 0.0),
        ("CORRAL_PROXY_COLD_START_TIMEOUT", "proxy_cold_start_timeout", 0.0),
        ("CORRAL_SERVICE_SCALING_TICK", "service_scaling_tick", 0.05),
        ("CORRAL_SERVICE_SCALING_WINDOW", "service_scaling_window", 1.0),
    ):
        if e.get(var):
            value = _float_env(e, var, 0.0)
            if value is None or value < least:
                raise SettingsError(f"{var}={e[var]!r} must be a number of seconds, at least {least:g}")
            s = replace(s, **{attr: value})  # type: ignore[arg-type]
    raw = e.get("CORRAL_PROXY_COLD_START_QUEUE")
    if raw:
        if not raw.isdigit():
            raise SettingsError(f"CORRAL_PROXY_COLD_START_QUEUE={raw!r} must be a whole number (0: hold none)")
        s = replace(s, proxy_cold_start_queue=int(raw))
    return s


def _clouds(s: Settings, e: dict[str, str]) -> Settings:
    """``CORRAL_AWS_CATALOG``, ``CORRAL_AWS_LIVE_CATALOG``, ``CORRAL_AWS_UNAVAILABLE_TTL``, ``CORRAL_ORPHAN_GRACE``,
    ``CORRAL_ORPHAN_ACTION``, ``CORRAL_ORPHAN_INTERVAL``."""
    if e.get("CORRAL_AWS_CATALOG"):
        s = replace(s, aws_catalog=Path(e["CORRAL_AWS_CATALOG"]).expanduser())
    live = (e.get("CORRAL_AWS_LIVE_CATALOG") or GPUHUNT_CATALOG_URL).strip()
    if live.lower() in ("off", "false", "0", "no"):
        s = replace(s, aws_live_catalog=None)
    elif live.startswith(("https://", "http://", "file://")):
        s = replace(s, aws_live_catalog=live)
    else:
        raise SettingsError(
            f"CORRAL_AWS_LIVE_CATALOG={live!r} must be off or a base URL (https://, http:// or file://) of "
            "gpuhunt's catalogues"
        )
    grace = _float_env(e, "CORRAL_ORPHAN_GRACE", Settings.orphan_grace)
    interval = _float_env(e, "CORRAL_ORPHAN_INTERVAL", Settings.orphan_interval)
    if grace is None or grace < 0 or interval is None or interval <= 0:
        raise SettingsError("CORRAL_ORPHAN_GRACE and CORRAL_ORPHAN_INTERVAL must be numbers of seconds")
    ttl = _float_env(e, "CORRAL_AWS_UNAVAILABLE_TTL", 120.0)
    if ttl is None or ttl < 0:
        raise SettingsError("CORRAL_AWS_UNAVAILABLE_TTL must be a number of seconds (0: remember nothing)")
    s = replace(s, aws_unavailable_ttl=ttl)
    pending = _float_env(e, "CORRAL_SLURM_MAX_PENDING", Settings.slurm_max_pending)
    if pending is None or pending < 0:
        raise SettingsError("CORRAL_SLURM_MAX_PENDING must be a number of seconds (0: no limit)")
    s = replace(s, slurm_max_pending=pending)
    raw = e.get("CORRAL_TERMINATION_STUCK_TRIES")
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            raise SettingsError(f"CORRAL_TERMINATION_STUCK_TRIES={raw!r} must be a whole number of at least 1")
        s = replace(s, termination_stuck_tries=int(raw))
    action = (e.get("CORRAL_ORPHAN_ACTION") or "terminate").lower()
    if action not in ("terminate", "report"):
        raise SettingsError(f"CORRAL_ORPHAN_ACTION={action!r} must be terminate or report")
    return replace(s, orphan_grace=grace, orphan_interval=interval, orphan_action=action)


def _local_host(s: Settings, e: dict[str, str]) -> Settings:
    """``CORRAL_LOCAL_CPUS``, ``CORRAL_LOCAL_MEMORY`` (e.g. ``16GB``) and ``CORRAL_LOCAL_BLOCKS``."""
    for var, attr in (("CORRAL_LOCAL_CPUS", "local_cpus"), ("CORRAL_LOCAL_BLOCKS", "local_blocks")):
        raw = e.get(var)
        if raw:
            if not raw.isdigit() or int(raw) < 1:
                raise SettingsError(f"{var}={raw!r} must be a whole number of at least 1")
            s = replace(s, **{attr: int(raw)})  # type: ignore[arg-type]
    raw = e.get("CORRAL_LOCAL_MEMORY")
    if raw:
        from corral.domain.resources import parse_memory

        try:
            gb = parse_memory(raw)
        except ValueError:
            gb = 0.0
        if gb <= 0:
            raise SettingsError(f"CORRAL_LOCAL_MEMORY={raw!r} must be a size such as 16GB or 512MB")
        s = replace(s, local_memory_mib=int(gb * 1024))
    return s


def _docker_in_docker(s: Settings, e: dict[str, str]) -> Settings:
    """``CORRAL_DIND_IMAGE`` (else dstack's ``DSTACK_DIND_IMAGE``) and ``CORRAL_ALLOW_DOCKER_IN_DOCKER``."""
    _, image = _either(e, "DIND_IMAGE")
    if image is not None:
        s = replace(s, dind_image=image)
    raw = e.get("CORRAL_ALLOW_DOCKER_IN_DOCKER")
    if raw:
        if raw.lower() not in ("1", "true", "on", "0", "false", "off"):
            raise SettingsError(f"CORRAL_ALLOW_DOCKER_IN_DOCKER={raw!r} must be true or false")
        s = replace(s, allow_docker_in_docker=raw.lower() in ("1", "true", "on"))
    return s


def _either(e: dict[str, str], name: str) -> tuple[str, str | None]:
    """``CORRAL_<name>``, else dstack's ``DSTACK_<name>``: (the variable found, its value)."""
    for var in ("CORRAL_" + name, "DSTACK_" + name):
        if e.get(var) not in (None, ""):
            return var, e[var]
    return "CORRAL_" + name, None


def _metrics(s: Settings, e: dict[str, str]) -> Settings:
    """Job metrics retention and the Prometheus endpoint, under corral's names or dstack's."""
    for name, attr in (
        ("SERVER_METRICS_RUNNING_TTL_SECONDS", "metrics_running_ttl"),
        ("SERVER_METRICS_FINISHED_TTL_SECONDS", "metrics_finished_ttl"),
    ):
        var, raw = _either(e, name)
        if raw is not None:
            try:
                value = float(raw)
            except ValueError:
                value = -1.0
            if not value >= 0:
                raise SettingsError(f"{var}={raw!r} must be a number of seconds, 0 or more")
            s = replace(s, **{attr: value})  # type: ignore[arg-type]
    # dstack turns the endpoint on when the variable is set at all (any value)
    enabled = any(("CORRAL_" if c else "DSTACK_") + "ENABLE_PROMETHEUS_METRICS" in e for c in (True, False))
    _, token = _either(e, "PROMETHEUS_AUTH_TOKEN")
    raw = e.get("CORRAL_UTILIZATION_MIN_WINDOW")
    if raw:
        window = _float_env(e, "CORRAL_UTILIZATION_MIN_WINDOW", None)
        if window is None or not 1 <= window <= 300:
            raise SettingsError(
                f"CORRAL_UTILIZATION_MIN_WINDOW={raw!r} must be a number of seconds from 1 to 300 (dstack's minimum, "
                "the default); it is for checks that cannot wait five minutes"
            )
        s = replace(s, utilization_min_window=window)
    return replace(s, enable_prometheus_metrics=enabled, prometheus_auth_token=token)


def _acme(s: Settings, e: dict[str, str]) -> Settings:
    """The ACME CA of gateways' certificates: ``CORRAL_ACME_*``, else dstack's ``DSTACK_ACME_*``."""
    var, server = _either(e, "ACME_SERVER")
    if server is not None and not server.startswith(("https://", "http://")):
        raise SettingsError(f"{var}={server!r} must be the URL of an ACME directory, such as {LETS_ENCRYPT_DIRECTORY}")
    kid_var, kid = _either(e, "ACME_EAB_KID")
    key_var, key = _either(e, "ACME_EAB_HMAC_KEY")
    if (kid is None) != (key is None):
        given, missing = (kid_var, key_var) if key is None else (key_var, kid_var)
        raise SettingsError(f"{given} is set but {missing} is not: External Account Binding needs both")
    bundle = e.get("CORRAL_ACME_CA_BUNDLE") or None
    if bundle is not None and not Path(bundle).expanduser().is_file():
        raise SettingsError(
            f"CORRAL_ACME_CA_BUNDLE={bundle!r} is not a file: point it at the PEM of the CA that the ACME server's "
            "TLS certificate chains to, or unset it to use the system store"
        )
    check = _float_env(e, "CORRAL_ACME_ACCOUNT_CHECK_INTERVAL", Settings.acme_account_check_interval)
    if check is None or check <= 0:
        raise SettingsError(
            f"CORRAL_ACME_ACCOUNT_CHECK_INTERVAL={e['CORRAL_ACME_ACCOUNT_CHECK_INTERVAL']!r} must be a number of "
            f"seconds above 0 (default {Settings.acme_account_check_interval:g})"
        )
    return replace(
        s,
        acme_account_check_interval=check,
        acme_server=server or LETS_ENCRYPT_DIRECTORY,
        acme_eab_kid=kid,
        acme_eab_hmac_key=key,
        acme_ca_bundle=Path(bundle).expanduser() if bundle else None,
    )


def _local_gateway(s: Settings, e: dict[str, str]) -> Settings:
    """``CORRAL_LOCAL_GATEWAY_HTTP_PORT`` and ``CORRAL_LOCAL_GATEWAY_HTTPS_PORT``: ports of this machine, 1-65535."""
    for var, attr in (
        ("CORRAL_LOCAL_GATEWAY_HTTP_PORT", "local_gateway_http_port"),
        ("CORRAL_LOCAL_GATEWAY_HTTPS_PORT", "local_gateway_https_port"),
    ):
        raw = e.get(var)
        if raw:
            if not raw.isdigit() or not 1 <= int(raw) <= 65535:
                raise SettingsError(f"{var}={raw!r} must be a port number from 1 to 65535")
            s = replace(s, **{attr: int(raw)})  # type: ignore[arg-type]
    if s.local_gateway_http_port == s.local_gateway_https_port:
        raise SettingsError(
            f"CORRAL_LOCAL_GATEWAY_HTTP_PORT and CORRAL_LOCAL_GATEWAY_HTTPS_PORT are both {s.local_gateway_http_port}: "
            "give them different ports"
        )
    return s
