"""The code ``corral apply`` sends with a run, computed as dstack's CLI does.

* **The repo** -- from ``--repo PATH_OR_URL`` or the configuration's ``repos`` (none: the virtual repo,
  so a run without ``repos`` gets no code, as with dstack 0.22.5; ``--no-repo`` drops ``repos``):
  a git checkout whose branch tracks a remote is a *remote* repo: its id and name come from the remote's
  URL, the commit is the remote-tracking branch's, and the code is ``git diff --binary <commit>`` plus a
  diff of each untracked, not ignored file -- the user's uncommitted work. A URL is a remote repo without
  a diff. A directory without a remote (not a git repo, or no upstream branch) is a *local* repo: its
  files travel as a tar archive (corral's extension: dstack 0.22.5's CLI refuses such directories).
  Remote URLs may also be local paths or ``file://`` URLs (corral's extension; the agent clones them on
  its host).
* **files** -- each ``files:`` entry becomes a tar archive (named by its SHA-256), uploaded only when
  ``files/get_archive_by_hash`` does not know it yet.

Archives leave out ``.git`` and what ``.gitignore``/``.dstackignore`` exclude (:mod:`corral.cli.ignore`).
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import string
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from corral.cli.errors import CLIError
from corral.cli.ignore import walk

JSON = dict[str, Any]
VIRTUAL = "none"


@dataclass
class RepoOptions:
    """``corral apply``'s repo flags (dstack's names)."""

    repo: str | None = None
    branch: str | None = None
    commit: str | None = None
    no_repo: bool = False
    oauth_token: str | None = None
    git_identity: str | None = None


@dataclass
class RepoUpload:
    repo_id: str
    repo_info: JSON
    repo_data: JSON
    repo_creds: JSON | None = None
    code: bytes = b""
    code_hash: str | None = field(default=None)

    def with_code(self, code: bytes) -> RepoUpload:
        self.code = code
        self.code_hash = hashlib.sha256(code).hexdigest() if code else None
        return self


def virtual_repo() -> RepoUpload:
    return RepoUpload(VIRTUAL, {"repo_type": "virtual"}, {"repo_type": "virtual"})


# ---- ids and URLs (the same repo ids as dstack's CLI) ---------------------------------------------


def _base36(value: bytes) -> str:
    digits = string.digits + string.ascii_lowercase
    n = len(value) * math.ceil(math.log(8) / math.log(36))
    number = int.from_bytes(value, "little", signed=False)
    out = []
    for _ in range(n):
        number, rem = divmod(number, 36)
        out.append(digits[rem])
    return "".join(reversed(out))


def slugify(prefix: str, unique_key: str) -> str:
    return f"{prefix}-{_base36(hashlib.sha256(unique_key.encode()).digest())[:8]}"


def _is_local(url: str) -> bool:
    return url.startswith(("/", "./", "../", "~", "file://")) or (
        "://" not in url and "@" not in url.split("/")[0] and ":" not in url.split("/")[0]
    )


def _local_path(url: str, base: Path) -> Path:
    """The repository a local URL (a path, relative to ``base``, or ``file://``) names."""
    path = Path(url.removeprefix("file://")).expanduser()
    return (path if path.is_absolute() else base / path).resolve()


def repo_location(url: str, base: Path | None = None) -> tuple[str, str]:
    """``(repo name, unique location)`` of a git URL: https/ssh/scp-like as dstack parses them, or a path
    (relative to ``base``, default: the current directory)."""
    if _is_local(url):
        clean = str(_local_path(url, base or Path.cwd())).rstrip("/").removesuffix(".git")
        return clean.rsplit("/", 1)[-1] or "unknown", f"file://{clean}"
    if "://" in url:
        parts = urlsplit(url)
        if parts.scheme.lower() not in ("https", "http", "ssh", "git"):
            raise CLIError(f"Unsupported git URL scheme in {url}")
        host, path = (parts.hostname or "").lower(), parts.path or "/"
    else:  # scp-like: user@host:path
        userhost, _, path = url.partition(":")
        host, path = userhost.rpartition("@")[2].lower(), "/" + path.lstrip("/")
    if not host:
        raise CLIError(f"Could not parse git URL {url}")
    clean = path.rstrip("/").removesuffix(".git")
    return clean.rsplit("/", 1)[-1] or "unknown", host + clean


def _creds(url: str, opts: RepoOptions, base: Path) -> JSON:
    key = None
    if opts.git_identity:
        try:
            key = Path(opts.git_identity).expanduser().read_text()
        except OSError as e:
            raise CLIError(f"Cannot read the git identity {opts.git_identity}: {e.strerror or e}") from None
    clone_url = str(_local_path(url, base)) if _is_local(url) else url
    return {"clone_url": clone_url, "private_key": key, "oauth_token": opts.oauth_token}


# ---- git ------------------------------------------------------------------------------------------------


def _git(cwd: Path, *args: str, ok_codes: tuple[int, ...] = (0,)) -> bytes:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=300, check=False)
    except FileNotFoundError:
        raise CLIError("git is not installed: it is needed to send the repo (use --no-repo to run without it)")
    except subprocess.TimeoutExpired:
        raise CLIError(f"`git {' '.join(args)}` did not finish within 5 minutes in {cwd}") from None
    if out.returncode not in ok_codes:
        raise _GitError(out.stderr.decode(errors="replace").strip())
    return out.stdout


class _GitError(Exception):
    pass


def _git_text(cwd: Path, *args: str) -> str | None:
    try:
        return _git(cwd, *args).decode().strip() or None
    except _GitError:
        return None


def _diff(top: Path, commit: str) -> bytes:
    """dstack's diff: tracked changes against ``commit``, then each untracked (not ignored) file as new."""
    try:
        chunks = [_git(top, "diff", "--binary", commit)]
        untracked = _git(top, "ls-files", "--others", "--exclude-standard", "-z").split(b"\0")
        for name in sorted(n.decode() for n in untracked if n):
            chunks.append(_git(top, "diff", "--no-index", "--binary", "/dev/null", name, ok_codes=(0, 1)))
    except _GitError as e:
        raise CLIError(f"Cannot compute the diff of the repo at {top}: {e}") from None
    return b"".join(chunks)


def from_dir(path: Path, opts: RepoOptions) -> RepoUpload:
    """The repo of a local directory: remote (diff) when its branch tracks a remote, else local (archive)."""
    if not path.is_dir():
        raise CLIError(f"Invalid repo path: {path} is not a directory")
    top_text = _git_text(path, "rev-parse", "--show-toplevel")
    if top_text is None:
        return local_repo(path)
    top = Path(top_text)
    head = _git_text(top, "symbolic-ref", "-q", "HEAD")
    if head is None:
        raise CLIError(f"Git repo in 'detached HEAD' state: {top}\nCheck out to a branch")
    branch = head.removeprefix("refs/heads/")
    remote = _git_text(top, "config", "--get", f"branch.{branch}.remote")
    merge = _git_text(top, "config", "--get", f"branch.{branch}.merge")
    url = _git_text(top, "config", "--get", f"remote.{remote}.url") if remote and remote != "." else None
    commit = _git_text(top, "rev-parse", "--verify", "-q", "@{upstream}") if url else None
    if url is None or merge is None or commit is None:
        return local_repo(top)
    name, location = repo_location(url, top)
    data: JSON = {
        "repo_type": "remote",
        "repo_name": name,
        "repo_branch": merge.removeprefix("refs/heads/"),
        "repo_hash": commit,
        "repo_config_name": _git_text(top, "config", "user.name"),
        "repo_config_email": _git_text(top, "config", "user.email"),
    }
    info = {"repo_type": "remote", "repo_name": name}
    return RepoUpload(slugify(name, location), info, data, _creds(url, opts, top)).with_code(_diff(top, commit))


def from_url(url: str, opts: RepoOptions) -> RepoUpload:
    name, location = repo_location(url)
    data: JSON = {"repo_type": "remote", "repo_name": name, "repo_branch": opts.branch, "repo_hash": opts.commit}
    info = {"repo_type": "remote", "repo_name": name}
    return RepoUpload(slugify(name, location), info, data, _creds(url, opts, Path.cwd()))


def local_repo(path: Path) -> RepoUpload:
    top = path.resolve()
    info = {"repo_type": "local", "repo_dir": str(top)}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for p in walk(top):
            if p != top:
                tar.add(p, arcname=p.relative_to(top).as_posix(), recursive=False)
    return RepoUpload(slugify(top.name or "repo", str(top)), info, dict(info)).with_code(buf.getvalue())


def _is_url(value: str) -> bool:
    return not _is_local(value) or value.startswith("file://")


def _repo_spec(raw: JSON) -> JSON | None:
    specs = raw.get("repos") or []
    if not specs:
        return None
    from corral.config import RepoSpec

    return RepoSpec.model_validate(specs[0]).model_dump(mode="json")  # validated already; splits shorthand


def repo_dir_of(raw: JSON) -> str | None:
    """The RunSpec's ``repo_dir``: ``repos[0].path`` (dstack's client sends it so)."""
    spec = _repo_spec(raw)
    return str(spec["path"]) if spec is not None else None


def for_run(raw: JSON, config_dir: Path, opts: RepoOptions) -> RepoUpload:
    """The repo of a run: ``--repo`` wins over the configuration's ``repos``; neither (or ``--no-repo``)
    gives the virtual repo."""
    if opts.no_repo:
        if opts.repo:
            raise CLIError("Either --repo or --no-repo can be specified")
        raw.pop("repos", None)
        return virtual_repo()
    opts = RepoOptions(**vars(opts))
    if opts.repo:
        if _is_url(opts.repo):
            return from_url(opts.repo, opts)
        return from_dir(Path(opts.repo).expanduser().resolve(), opts)
    spec = _repo_spec(raw)
    if spec is None:
        return virtual_repo()
    opts.branch = opts.branch or spec.get("branch")
    opts.commit = opts.commit or spec.get("hash")
    if spec.get("url"):
        return from_url(str(spec["url"]), opts)
    local = Path(str(spec["local_path"])).expanduser()
    path = local if local.is_absolute() else (config_dir / local).resolve()
    if not path.exists():
        raise CLIError(f"Invalid repo path: {spec['local_path']} -> {path}")
    return from_dir(path, opts)  # a checkout's own branch and commit win, as with dstack


# ---- files ------------------------------------------------------------------------------------------------


def file_archive(root: Path) -> bytes:
    """The tar archive dstack's CLI makes of a ``files:`` entry: names relative to ``root``'s parent;
    symlinks that stay inside ``root`` are kept (made relative), others are replaced by what they point to."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in walk(root):
            arcname = path.relative_to(root.parent).as_posix()
            if path.is_symlink():
                target = Path(os.path.normpath(path.parent / os.readlink(path)))
                if target == root or root in target.parents:
                    info = tar.gettarinfo(str(path), arcname)
                    info.linkname = os.path.relpath(target, path.parent)
                    tar.addfile(info)
                elif path.exists():
                    tar.add(str(path.resolve()), arcname=arcname, recursive=False)
                continue
            tar.add(str(path), arcname=arcname, recursive=False)
    return buf.getvalue()


def upload_files(client: Any, raw: JSON, config_dir: Path) -> list[JSON]:
    """Archive and upload each ``files:`` entry (unless the server has it); their ``{id, path}``s.
    The entries' local paths become absolute in ``raw``, as dstack's client sends them."""
    from corral.config.run_parts import FilePathMapping
    from corral.sdk.errors import ResourceNotExistsError

    out: list[JSON] = []
    entries = raw.get("files") or []
    for i, entry in enumerate(entries):
        mapping = FilePathMapping.model_validate(entry)
        local = Path(mapping.local_path).expanduser()
        path = local if local.is_absolute() else config_dir / local
        if not path.exists() and not path.is_symlink():
            raise CLIError(f"Path '{path}' specified in `files` does not exist")
        root = Path(os.path.abspath(path))
        try:
            data = file_archive(root.resolve() if root.is_symlink() else root)
        except OSError as e:
            raise CLIError(f"failed to archive '{mapping.local_path}': {e}") from None
        digest = hashlib.sha256(data).hexdigest()
        try:
            archive = client.files_get_archive_by_hash(digest)
        except ResourceNotExistsError:
            archive = client.files_upload_archive(digest, data)
        entries[i] = {"local_path": str(root), "path": mapping.path}
        out.append({"id": archive["id"], "path": mapping.path})
    return out
