"""The job's files before its commands run: blobs, the repo checkout, ``files:`` archives, the layout.

Standard library only, plus the host's ``git`` (run as a subprocess) for remote repos.

**Blobs.** The server pushes what a job needs (``PUT /blobs/{sha256}``) before it submits the job: the
diff or code archive of the repo, the ``files:`` archives. They are kept in ``<work dir>/blobs`` by their
hash (verified on arrival), so a blob several jobs share travels once; unused ones are pruned after a day.

**Layout.** Jobs run as host processes, so the paths a ``.dstack.yml`` gives (meant for a container) are
mapped into the job's own directory, ``root`` (``jobs/<id>/workdir``), which stands in for the container's
filesystem root: an absolute path ``/a/b`` becomes ``root/a/b``, ``~`` becomes ``root/<home_dir>``, a
relative path is relative to the working dir. Without ``working_dir`` the working dir is ``root`` itself
(a container's default working dir); ``repo_dir`` (``repos[].path``, default ``.``) is relative to the
working dir; a relative ``working_dir`` (dstack before 0.20) is relative to the repo dir. Nothing is ever
written outside ``root``. A sandboxed job sees ``root`` as its ``/`` (:mod:`corral.agent.sandbox_layout`),
so the paths are the configuration's own; a plain host process learns the real ones from
``DSTACK_REPO_DIR`` and ``DSTACK_WORKING_DIR``.

**Order** (as dstack's runner): the repo (remote: ``git clone`` at the branch, checkout of the commit, then
``git apply`` of the diff; local/virtual: unpack the tar archive), then each ``files:`` archive. Any
failure is a :class:`SetupError` whose message tells the user what went wrong (git's own words included).
"""

from __future__ import annotations

import base64
import hashlib
import os
import posixpath
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol  # noqa: UP035 - evaluated at run time on Python 3.8

from .protocol import FileArchiveRef, JobSubmission, RepoCheckout

BLOB_RE = re.compile(r"^[0-9a-f]{64}$")
BLOB_MAX_AGE_S = 24 * 3600.0
_CHUNK = 1 << 20
_OUTPUT_TAIL = 1500


class SetupError(Exception):
    """The job's files could not be prepared; the message is meant for the user."""


class SetupStopped(Exception):
    """The job was stopped while its files were being prepared."""


#: Called with each subprocess the setup starts (None once it ended) so that a stop can kill it;
#: raises :class:`SetupStopped` when the job has been stopped meanwhile.
Register = Callable[[Optional["subprocess.Popen[bytes]"]], None]


class _Readable(Protocol):
    def read(self, n: int, /) -> bytes: ...


class BlobStore:
    """Content-addressed files under ``<work dir>/blobs``."""

    def __init__(self, work_dir: str) -> None:
        self.dir = os.path.join(work_dir, "blobs")
        os.makedirs(self.dir, exist_ok=True)

    def path(self, blob_hash: str) -> str:
        if not BLOB_RE.match(blob_hash):
            raise ValueError(f"invalid blob hash {blob_hash!r}: expected 64 lowercase hex digits")
        return os.path.join(self.dir, blob_hash)

    def size(self, blob_hash: str) -> int | None:
        """The blob's size, or None if it is not here (a hit also marks it as recently used)."""
        path = self.path(blob_hash)
        try:
            os.utime(path)
            return os.path.getsize(path)
        except FileNotFoundError:
            return None

    def put(self, blob_hash: str, stream: _Readable, length: int) -> int:
        """Store ``length`` bytes from ``stream``; ValueError if they do not hash to ``blob_hash``."""
        path = self.path(blob_hash)
        digest = hashlib.sha256()
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".incoming-")
        try:
            with os.fdopen(fd, "wb") as f:
                left = length
                while left > 0:
                    chunk = stream.read(min(_CHUNK, left))
                    if not chunk:
                        raise ValueError(f"blob {blob_hash}: the body ended after {length - left} of {length} bytes")
                    digest.update(chunk)
                    f.write(chunk)
                    left -= len(chunk)
            if digest.hexdigest() != blob_hash:
                raise ValueError(f"blob {blob_hash}: the content hashes to {digest.hexdigest()}")
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return length

    def prune(self, max_age: float = BLOB_MAX_AGE_S) -> None:
        cutoff = time.time() - max_age
        for name in os.listdir(self.dir):
            path = os.path.join(self.dir, name)
            try:
                if os.path.getmtime(path) < cutoff:
                    os.unlink(path)
            except OSError:
                pass


# ---- layout --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    root: str
    repo_dir: str
    working_dir: str


def host_path(root: str, path: str, relative_to: str, home_dir: str) -> str:
    """Where the container path ``path`` lives on the host (see the module docstring); never outside root."""
    if path == "~" or path.startswith("~/"):
        full = os.path.join(root, home_dir.lstrip("/"), path[2:])
    elif path.startswith("/"):
        full = os.path.join(root, path.lstrip("/"))
    else:
        full = os.path.join(relative_to, path)
    full = os.path.normpath(full)
    if full != root and not full.startswith(root.rstrip(os.sep) + os.sep):
        raise SetupError(f"The path {path!r} leads outside the job's directory")
    return full


def layout(root: str, sub: JobSubmission) -> Layout:
    root = os.path.normpath(os.path.abspath(root))
    home = sub.home_dir
    repo_dir = sub.repo.repo_dir if sub.repo is not None else "."
    wd = sub.working_dir
    legacy = wd is not None and not wd.startswith(("/", "~"))
    base = root if wd is None or legacy else host_path(root, wd, root, home)
    repo = host_path(root, repo_dir, base, home)
    working = host_path(root, wd, repo, home) if legacy and wd is not None else base
    return Layout(root=root, repo_dir=repo, working_dir=working)


# ---- preparing the job's files ------------------------------------------------------------------------


def prepare(root: str, scratch: str, sub: JobSubmission, blobs: BlobStore, register: Register) -> Layout:
    """Build the job's files under ``root`` (``scratch``: a private dir for temporary files); returns the
    layout. Raises :class:`SetupError` or :class:`SetupStopped`."""
    lay = layout(root, sub)
    os.makedirs(lay.root, exist_ok=True)
    if sub.repo is not None:
        _prepare_repo(sub.repo, lay.repo_dir, scratch, blobs, register)
    for archive in sub.file_archives:
        _unpack_files(archive, lay, sub.home_dir, blobs)
    os.makedirs(lay.working_dir, exist_ok=True)
    os.makedirs(lay.repo_dir, exist_ok=True)
    return lay


def _blob(blobs: BlobStore, blob_hash: str, what: str) -> str:
    path = blobs.path(blob_hash)
    if not os.path.isfile(path):
        raise SetupError(f"The {what} (blob {blob_hash}) is missing on this host; the server did not deliver it")
    return path


def _prepare_repo(repo: RepoCheckout, dest: str, scratch: str, blobs: BlobStore, register: Register) -> None:
    if os.path.isdir(dest) and os.listdir(dest):
        if repo.if_exists == "error":
            raise SetupError(f"The repo dir {dest} already exists and is not empty (the repo sets `if_exists: error`)")
        return  # `skip`, and dstack's default when the spec says nothing
    if repo.repo_type == "remote":
        _clone(repo, dest, scratch, register)
        if repo.code_hash is not None:
            _apply_diff(repo, dest, _blob(blobs, repo.code_hash, "repo diff"), register)
    elif repo.code_hash is not None:
        os.makedirs(dest, exist_ok=True)
        with _open_tar(_blob(blobs, repo.code_hash, "repo archive"), "repo archive") as tar:
            _extract(tar, dest, list(_members(tar, "repo archive")), "repo archive")


# ---- git ------------------------------------------------------------------------------------------------


def _git() -> str:
    git = shutil.which("git")
    if git is None:
        raise SetupError(
            "git is not installed on this host: the agent needs it to check out the run's repo "
            "(install git, e.g. `apt-get install git`, or run without the repo)"
        )
    return git


def _plain_env() -> dict[str, str]:
    """git that never prompts and speaks English (its messages go to the user)."""
    env = dict(os.environ)
    env.update(GIT_TERMINAL_PROMPT="0", GIT_ASKPASS="", SSH_ASKPASS="", LC_ALL="C")
    return env


def _git_env(repo: RepoCheckout, scratch: str) -> tuple[dict[str, str], list[str]]:
    """The environment of the clone (credentials through env config, not argv), and the secrets to mask
    in anything shown to the user."""
    env = _plain_env()
    secrets: list[str] = []
    extra: list[tuple[str, str]] = []
    url = repo.clone_url or ""
    if repo.oauth_token and url.lower().startswith(("https://", "http://")):
        basic = base64.b64encode(f"anything:{repo.oauth_token}".encode()).decode()
        extra.append(("http.extraHeader", f"Authorization: Basic {basic}"))
        secrets += [repo.oauth_token, basic]
    if repo.private_key:
        key_path = os.path.join(scratch, "git-identity")
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(repo.private_key if repo.private_key.endswith("\n") else repo.private_key + "\n")
        env["GIT_SSH_COMMAND"] = (
            f"ssh -F /dev/null -i '{key_path}' -o IdentitiesOnly=yes "
            "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes"
        )
    if extra:  # append to any GIT_CONFIG_COUNT the host already sets
        try:
            n = int(env.get("GIT_CONFIG_COUNT") or 0)
        except ValueError:
            n = 0
        for key, value in extra:
            env[f"GIT_CONFIG_KEY_{n}"], env[f"GIT_CONFIG_VALUE_{n}"] = key, value
            n += 1
        env["GIT_CONFIG_COUNT"] = str(n)
    return env, secrets


def _run_git(args: list[str], cwd: str, env: dict[str, str], register: Register, secrets: list[str]) -> str:
    proc = subprocess.Popen(
        args,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        register(proc)
        out, _ = proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        register(None)
    text = out.decode(errors="replace").strip()
    for secret in secrets:
        text = text.replace(secret, "***")
    if proc.returncode != 0:
        raise _GitFailed(proc.returncode, text[-_OUTPUT_TAIL:])
    return text


class _GitFailed(Exception):
    def __init__(self, code: int, output: str) -> None:
        super().__init__(output)
        self.code = code
        self.output = output or f"exit code {code}"


def _clone(repo: RepoCheckout, dest: str, scratch: str, register: Register) -> None:
    git = _git()
    env, secrets = _git_env(repo, scratch)
    url = repo.clone_url or ""
    shown = url
    try:
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        args = [git, "clone", "--quiet"]
        if repo.branch:
            args += ["--branch", repo.branch]
            if repo.single_branch:
                args.append("--single-branch")
        try:
            _run_git([*args, "--", url, dest], os.path.dirname(dest), env, register, secrets)
        except _GitFailed as e:
            at = f" (branch {repo.branch})" if repo.branch else ""
            raise SetupError(f"Cannot clone the repo {shown}{at}: {e.output}") from None
        if repo.commit:
            _checkout_commit(git, repo, dest, env, register, secrets)
        for key, value in (("user.name", repo.git_user_name), ("user.email", repo.git_user_email)):
            if value:
                _run_git([git, "config", key, value], dest, env, register, secrets)
    finally:
        key_path = os.path.join(scratch, "git-identity")
        if os.path.exists(key_path):
            os.unlink(key_path)


def _checkout_commit(
    git: str, repo: RepoCheckout, dest: str, env: dict[str, str], register: Register, secrets: list[str]
) -> None:
    commit = repo.commit or ""
    target = ["-B", repo.branch, commit] if repo.branch else ["--detach", commit]
    try:
        _run_git([git, "checkout", "--quiet", *target], dest, env, register, secrets)
        return
    except _GitFailed:
        pass
    try:  # not in the history a single-branch clone fetched: ask for the commit itself
        _run_git([git, "fetch", "--quiet", "origin", commit], dest, env, register, secrets)
        _run_git([git, "checkout", "--quiet", *target], dest, env, register, secrets)
    except _GitFailed as e:
        raise SetupError(f"Cannot check out commit {commit} of the repo {repo.clone_url}: {e.output}") from None


def _apply_diff(repo: RepoCheckout, dest: str, diff_path: str, register: Register) -> None:
    if os.path.getsize(diff_path) == 0:
        return
    git = _git()
    try:
        _run_git([git, "apply", "--whitespace=nowarn", diff_path], dest, _plain_env(), register, [])
    except _GitFailed as e:
        at = f"commit {repo.commit}" if repo.commit else f"the head of {repo.branch or 'the default branch'}"
        raise SetupError(
            f"The uncommitted changes (the diff uploaded with the run) do not apply to {at} of {repo.clone_url}: "
            f"{e.output}"
        ) from None


# ---- tar archives ---------------------------------------------------------------------------------------


def _open_tar(path: str, what: str) -> tarfile.TarFile:
    try:
        return tarfile.open(path, "r:*")
    except (tarfile.TarError, OSError) as e:
        raise SetupError(f"The {what} is not a readable tar archive: {e}") from None


def _members(tar: tarfile.TarFile, what: str) -> Iterator[tarfile.TarInfo]:
    try:
        yield from tar
    except tarfile.TarError as e:
        raise SetupError(f"The {what} is corrupt: {e}") from None


def _check_member(m: tarfile.TarInfo, dest: str, what: str) -> None:
    """Refuse what could write outside ``dest`` (absolute names, ``..``, links that lead out)."""

    def inside(rel: str, base: str) -> bool:
        full = os.path.normpath(os.path.join(base, rel))
        return full == dest or full.startswith(dest.rstrip(os.sep) + os.sep)

    if m.name.startswith("/") or not inside(m.name, dest):
        raise SetupError(f"The {what} holds {m.name!r}, a path outside its directory")
    if m.issym() and (
        m.linkname.startswith("/") or not inside(m.linkname, os.path.join(dest, posixpath.dirname(m.name)))
    ):
        raise SetupError(f"The {what} holds a symlink {m.name!r} -> {m.linkname!r} that leads outside its directory")
    if m.islnk() and (m.linkname.startswith("/") or not inside(m.linkname, dest)):
        raise SetupError(f"The {what} holds a hard link {m.name!r} -> {m.linkname!r} that leads outside it")


def _extract(tar: tarfile.TarFile, dest: str, members: list[tarfile.TarInfo], what: str) -> None:
    dest = os.path.normpath(dest)
    keep = [m for m in members if m.isfile() or m.isdir() or m.issym() or m.islnk()]
    for m in keep:
        _check_member(m, dest, what)
    kwargs: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    try:
        tar.extractall(dest, members=keep, **kwargs)
    except (tarfile.TarError, OSError) as e:
        raise SetupError(f"Cannot unpack the {what} into {dest}: {e}") from None


_TOP = re.compile(r"^([^/]*)(/|$)")


def _unpack_files(archive: FileArchiveRef, lay: Layout, home_dir: str, blobs: BlobStore) -> None:
    """dstack's rule: the archive's top-level entry (the file or directory the user named) lands at
    ``path``, replacing whatever was there."""
    what = f"file archive for {archive.path}"
    target = host_path(lay.root, archive.path.rstrip("/") or "/", lay.working_dir, home_dir)
    if target == lay.root:
        raise SetupError(f"`files` cannot replace the job's whole directory ({archive.path!r})")
    parent, name = os.path.split(target)
    os.makedirs(parent, exist_ok=True)
    if os.path.isdir(target) and not os.path.islink(target):
        shutil.rmtree(target)
    elif os.path.lexists(target):
        os.unlink(target)
    with _open_tar(_blob(blobs, archive.hash, what), what) as tar:
        members = list(_members(tar, what))
        for m in members:
            m.name = _TOP.sub(lambda mt: name + mt.group(2), m.name, count=1)
            if m.islnk():
                m.linkname = _TOP.sub(lambda mt: name + mt.group(2), m.linkname, count=1)
        _extract(tar, parent, members, what)
