"""Which files of a directory travel with a run: everything except what ``.gitignore`` and
``.dstackignore`` files exclude (gitignore syntax), and ``.git`` directories -- what dstack's CLI
archives for ``files:`` and local repos.

Rules of a directory's ignore files apply below that directory; later rules override earlier ones, the
rules of deeper directories override those of their parents, and nothing inside an excluded directory is
looked at (so it cannot be re-included), as in git.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

IGNORE_FILES = (".gitignore", ".dstackignore")


@dataclass(frozen=True)
class Rule:
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool

    def matches(self, rel: str, is_dir: bool) -> bool:
        return (is_dir or not self.dir_only) and self.regex.match(rel) is not None


def _glob(pattern: str) -> str:
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.find("]", i + 2 if pattern[i + 1 : i + 2] in ("!", "^", "]") else i + 1)
            if end == -1:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : end]
                if body[:1] in ("!", "^"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = end
        elif c == "\\" and i + 1 < n:
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def parse_rule(line: str, base: str) -> Rule | None:
    """One line of an ignore file in directory ``base`` (relative, posix, "" for the top)."""
    line = line.rstrip("\r\n")
    while line.endswith(" ") and not line.endswith("\\ "):
        line = line[:-1]
    if not line or line.startswith("#"):
        return None
    negate = line.startswith("!")
    if negate or line.startswith(("\\!", "\\#")):
        line = line[1:]
    dir_only = line.endswith("/")
    line = line.rstrip("/")
    if not line:
        return None
    anchored = "/" in line
    line = line.lstrip("/")
    prefix = re.escape(base + "/") if base else ""
    middle = "" if anchored else "(?:.*/)?"
    return Rule(re.compile(f"^{prefix}{middle}{_glob(line)}$", re.DOTALL), negate, dir_only)


def _rules_of(directory: Path, base: str) -> list[Rule]:
    rules: list[Rule] = []
    for name in IGNORE_FILES:
        try:
            text = (directory / name).read_text(errors="replace")
        except OSError:
            continue
        rules += [r for r in (parse_rule(line, base) for line in text.splitlines()) if r is not None]
    return rules


def _ignored(rules: list[Rule], rel: str, is_dir: bool) -> bool:
    verdict = False
    for rule in rules:
        if rule.matches(rel, is_dir):
            verdict = not rule.negate
    return verdict


def walk(root: Path) -> list[Path]:
    """``root`` (a file or a directory) and what lies under it that is not ignored, sorted."""
    if not root.is_dir() or root.is_symlink():
        return [root]
    found = [root]

    def visit(directory: Path, base: str, rules: list[Rule]) -> None:
        rules = rules + _rules_of(directory, base)
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            return
        for entry in entries:
            rel = f"{base}/{entry.name}" if base else entry.name
            is_dir = entry.is_dir(follow_symlinks=False)
            if (is_dir and entry.name == ".git") or _ignored(rules, rel, is_dir):
                continue
            path = Path(entry.path)
            found.append(path)
            if is_dir:
                visit(path, rel, rules)

    visit(root, "", [])
    return sorted(found)
