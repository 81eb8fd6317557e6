"""The one on-disk cache of profiles and frontiers: a restart does not profile or plan again.

Used by the runtime (one entry per training job) and by ``perseus emulate --sweep --cache-dir``
(one entry per schedule and profile). Layout: ``<cache_dir>/<hash>/key.json`` (the full key,
readable), ``profile.json``, ``frontier.json``, and while a sweep is under way
``partial_profile.json`` (the clocks measured so far, so a run that ends while profiling is resumed
by the next; removed once the profile is saved). The hash covers everything the caller says
determines a profile and its frontier (the runtime: the key's layout version, the adapter's model
description and every stage's parameters, schedule, stages, microbatches, chunks, tensor- and
data-parallel size, the swept clocks, GPU name and driver version, docs/runtime.md "Cache"; the
emulator: the schedule and a digest of the profile). Each stored file also
carries the hash, so a file copied between directories is caught, and a frontier carries the
version of the schedule-dependency model it was planned under, so a frontier planned under older
rules is planned again. A cache entry that cannot be read, does not parse, or belongs to another
key is reported as a warning naming the file and the problem, and is rebuilt; it is never used
silently. Writes are atomic (``perseus.atomic``).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

from perseus.atomic import write_atomic
from perseus.errors import FrontierError, ProfileError
from perseus.frontier import Frontier, encode_frontier_json, load_frontier
from perseus.profile import Profile, encode_profile_json, load_json
from perseus.schedules import DAG_MODEL_VERSION, Schedule

log = logging.getLogger("perseus.store.cache")

KEY_FILE = "key.json"
PROFILE_FILE = "profile.json"
FRONTIER_FILE = "frontier.json"
PARTIAL_FILE = "partial_profile.json"
PARTIAL_FORMAT = "perseus-partial-profile"
PARTIAL_VERSION = 1
CACHE_KEY_FIELD = "cache_key"
DAG_MODEL_FIELD = "dag_model"


def key_hash(key: Mapping[str, Any]) -> str:
    """Stable short hash of a JSON-able key (sorted keys, so dict order does not matter)."""
    text = json.dumps(key, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def write_json_atomic(path: Path, data: Any, compact: bool = False) -> None:
    """Temporary file + rename: readers see the old file or the new one, never half of one."""
    text = json.dumps(data, separators=(",", ":"), default=str) if compact else json.dumps(data, indent=1, default=str)
    write_atomic(path, text)


class RunCache:
    """Profile and frontier files of one cache key."""

    def __init__(self, root: str | Path, key: Mapping[str, Any]) -> None:
        self.key = json.loads(json.dumps(dict(key), sort_keys=True, default=str))
        self.hash = key_hash(self.key)
        self.dir = Path(root) / self.hash

    @property
    def profile_path(self) -> Path:
        return self.dir / PROFILE_FILE

    @property
    def frontier_path(self) -> Path:
        return self.dir / FRONTIER_FILE

    @property
    def partial_path(self) -> Path:
        return self.dir / PARTIAL_FILE

    def _key_ok(self) -> bool:
        """True when the directory's key.json is this key; warns when it exists but differs."""
        path = self.dir / KEY_FILE
        if not path.exists():
            return False
        stored = _read_json(path, "rebuilding the cache entry")
        if stored is None:
            return False
        if stored != self.key:
            differs = sorted(k for k in set(stored) | set(self.key) if stored.get(k) != self.key.get(k))
            log.warning(
                "perseus cache: %s belongs to another job (differs in: %s); ignoring it and rebuilding",
                path,
                ", ".join(differs) or "structure",
            )
            return False
        return True

    def load_profile(self) -> Profile | None:
        """The cached profile, or None (with a warning when a file exists but is not usable)."""
        profile = self._load(self.profile_path, load_json, ProfileError, "profiling again")
        if profile is None or not self._stamped(self.profile_path, profile.config, "profiling again"):
            return None
        return profile

    def load_frontier(self, schedule: Schedule) -> Frontier | None:
        """The cached frontier if it is for this key and this schedule, else None (with a warning)."""
        path = self.frontier_path
        frontier = self._load(path, load_frontier, FrontierError, "planning again")
        if frontier is None or not self._stamped(path, frontier.metadata, "planning again"):
            return None
        if frontier.schedule != schedule:
            log.warning("perseus cache: %s holds a different schedule than this job; planning again", path)
            return None
        if frontier.metadata.get(DAG_MODEL_FIELD) != DAG_MODEL_VERSION:
            log.warning("perseus cache: %s was planned with an older model of the schedule's dependencies "
                        "(version %r, now %r); planning again", path, frontier.metadata.get(DAG_MODEL_FIELD),
                        DAG_MODEL_VERSION)
            return None
        return frontier

    def _load(self, path: Path, loader: Any, error: type[Exception], then: str) -> Any:
        if not path.exists() or not self._key_ok():
            return None
        try:
            return loader(path)
        except error as exc:
            log.warning("perseus cache: %s is corrupt (%s); %s", path, exc, then)
            return None

    def _stamped(self, path: Path, fields: Mapping[str, Any], then: str) -> bool:
        """The file carries this entry's hash (it was not copied in from another key)."""
        if fields.get(CACHE_KEY_FIELD) == self.hash:
            return True
        log.warning("perseus cache: %s was written for cache key %r, not %r; %s",
                    path, fields.get(CACHE_KEY_FIELD), self.hash, then)
        return False

    def _prepare(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.dir / KEY_FILE, self.key)

    def save_profile(self, profile: Profile) -> Path:
        self._prepare()
        stamped = replace(profile, config={**dict(profile.config), CACHE_KEY_FIELD: self.hash},
                          source=str(self.profile_path))
        write_json_atomic(self.profile_path, encode_profile_json(stamped))
        return self.profile_path

    def save_partial(self, state: Mapping[str, Any]) -> Path:
        """The sweep so far (plain JSON data from the runtime), stamped with this key; atomic."""
        self._prepare()
        data = {"format": PARTIAL_FORMAT, "version": PARTIAL_VERSION, CACHE_KEY_FIELD: self.hash, **dict(state)}
        write_json_atomic(self.partial_path, data, compact=True)
        return self.partial_path

    def load_partial(self) -> dict[str, Any] | None:
        """An interrupted sweep of this key, or None (with a warning when a file exists but is not usable)."""
        path = self.partial_path
        if not path.exists() or not self._key_ok():
            return None
        data = _read_json(path, "profiling from the start")
        if data is None:
            return None
        if not isinstance(data, dict) or data.get("format") != PARTIAL_FORMAT or data.get("version") != PARTIAL_VERSION:
            log.warning("perseus cache: %s is not a version-%d partial profile; profiling from the start",
                        path, PARTIAL_VERSION)
            return None
        if not self._stamped(path, data, "profiling from the start"):
            return None
        return data

    def clear_partial(self) -> None:
        """The sweep finished (its profile is saved): nothing to resume."""
        try:
            self.partial_path.unlink()
        except FileNotFoundError:
            pass

    def save_frontier(self, frontier: Frontier) -> Path:
        self._prepare()
        frontier.metadata[CACHE_KEY_FIELD] = self.hash
        frontier.metadata[DAG_MODEL_FIELD] = DAG_MODEL_VERSION
        data = encode_frontier_json(frontier)
        write_json_atomic(self.frontier_path, data, compact=True)
        return self.frontier_path


def _read_json(path: Path, instead: str) -> Any | None:
    """A cache file's JSON, or None with one warning saying what happens ``instead``."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        log.warning("perseus cache: %s is unreadable (%s); %s", path, exc, instead)
        return None
