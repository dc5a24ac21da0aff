"""The answers of the server's token check, kept 60 s per (project, token) as dstack's gateway keeps them
(dstack 0.22.5's gateway app, ``proxy/gateway/``: its auth check caches answers 60 s), allowed and refused alike."""

from __future__ import annotations

from typing import Optional

TTL = 60.0


class AuthCache:
    def __init__(self, ttl: float = TTL, max_entries: int = 10000) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._answers: dict[tuple[str, str], tuple[bool, float]] = {}

    def get(self, project: str, token: str, now: float) -> Optional[bool]:
        answer = self._answers.get((project, token))
        if answer is None or answer[1] <= now:
            return None
        return answer[0]

    def put(self, project: str, token: str, allowed: bool, now: float) -> None:
        if len(self._answers) >= self.max_entries:
            self._answers = {k: v for k, v in self._answers.items() if v[1] > now}
        if len(self._answers) >= self.max_entries:
            self._answers.clear()
        self._answers[(project, token)] = (allowed, now + self.ttl)
