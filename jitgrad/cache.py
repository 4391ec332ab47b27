"""The on-disk kernel cache: where it lives, what its directory is keyed on, verified atomic entry
files, least-recently-used eviction, and one warning when the disk cannot be used. Over 400 lines:
its file format, trust checks and eviction stay in one module so that its security rules can be
read together.

Layout: `<base>/<version tag>/jitgrad_kernel_<source hash>.py` (the generated source, for people
and tracebacks) beside `jitgrad_kernel_<source hash>.<function>.<signature hash>.nbk` (machine
code, one file per compiled signature). A kernel "entry" is every file sharing the
`jitgrad_kernel_<source hash>` stem; a compiled program is one file, `jitgrad_program_<key hash>.jgp`,
its own entry. Eviction removes whole entries, oldest use first. This module knows files only:
`jitgrad.kernels.build.compiler` and `jitgrad.runtime.programs` decide what goes into them.

Machine code is unpickled, so a file is loaded only if its checksum, the key stored inside it and
its owner say it is this installation's entry for that key, written by this user (or root): the
directories are made 0700, and one that others can write or another user owns is refused.
"""
from __future__ import annotations

import hashlib
import logging
import os
import stat
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, NoReturn

ENTRY_PREFIX = "jitgrad_kernel_"
PROGRAM_PREFIX = "jitgrad_program_"  # a compiled program (`jitgrad.runtime.programs`): one file, its own entry
DEFAULT_MAX_MB = 512.0
_MAGIC = b"JGK2"
_DIGEST_BYTES = 32
_KEY_LENGTH_BYTES = 4
_PRIVATE_DIR = 0o700
_PRIVATE_FILE = 0o600

log = logging.getLogger("jitgrad.cache")
_lock = threading.Lock()
_unusable: set[str] = set()  # directories this process failed to write: warned once, never written again
_untrusted: set[str] = set()  # directories refused for their owner or mode: warned once, never read or written
_warned_settings: set[str] = set()


class CacheWarning(UserWarning):
    """The kernel cache cannot be used as configured; jitgrad carries on without it."""


class EntryRejected(Exception):
    """A machine code file exists but must not be loaded: damaged, another key's, or not ours."""


def enabled() -> bool:
    """False when `JITGRAD_CACHE=0`: kernels are then compiled in memory and nothing is written."""
    return os.environ.get("JITGRAD_CACHE", "1").strip() != "0"


def base_dir() -> str:
    """`JITGRAD_CACHE_DIR`, else `$XDG_CACHE_HOME/jitgrad`, else `~/.cache/jitgrad`."""
    chosen = os.environ.get("JITGRAD_CACHE_DIR")
    if chosen:
        return os.path.abspath(os.path.expanduser(chosen))
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "jitgrad")


@lru_cache(maxsize=None)
def version_tag() -> str:
    """The part of the key that is the same for every kernel: jitgrad, numba and Python versions."""
    import numba

    from jitgrad import __version__  # the package's, which tests/test_install.py keeps equal to pyproject's
    return f"jitgrad-{__version__}-numba-{numba.__version__}-py{sys.version_info.major}{sys.version_info.minor}"


def directory() -> str | None:
    """The directory for this process's entries, created 0700 on demand; None when the cache is off,
    the directory does not exist and cannot be made, or it is not trusted (the last two after one
    `CacheWarning`). A directory that cannot be written is still returned: its entries load, nothing
    new is stored."""
    if not enabled():
        return None
    base = base_dir()
    path = os.path.join(base, version_tag())
    if path in _untrusted:
        return None
    for folder in (base, path):
        if usable(path):
            try:
                os.makedirs(folder, mode=_PRIVATE_DIR, exist_ok=True)
            except OSError as exc:
                mark_unusable(path, exc)
        if not os.path.isdir(folder):
            return None
        problem = trust_problem(folder)
        if problem is not None:
            refuse(path, folder, problem)
            return None
    return path


def ownership_problem(st: os.stat_result) -> str | None:
    """Why a file or directory with this status could hold code from someone other than this user
    or root (None when it cannot): another owner, or group/other write permission."""
    if not hasattr(os, "geteuid"):  # no POSIX owners and modes (Windows): nothing to check
        return None
    uid = os.geteuid()
    if st.st_uid not in (uid, 0):
        return f"it is owned by uid {st.st_uid}, not by this user (uid {uid}){' or root' if uid else ''}"
    writers = [who for who, bit in (("its group", stat.S_IWGRP), ("other users", stat.S_IWOTH)) if st.st_mode & bit]
    if writers:
        return f"{' and '.join(writers)} can write it (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def trust_problem(folder: str) -> str | None:
    """Why entries in `folder` must not be loaded, or None when only this user or root can write it."""
    try:
        return ownership_problem(os.stat(folder))
    except OSError as exc:
        return f"its owner and mode cannot be read ({exc.strerror or exc})"


def refuse(path: str, folder: str, problem: str) -> None:
    """Use no entries of `path` (neither load nor write) for the rest of the process, warning once."""
    with _lock:
        if path in _untrusted:
            return
        _untrusted.add(path)
    warnings.warn(f"jitgrad will not use its kernel cache at {folder}: {problem}. Cached kernels are pickled "
                  f"machine code, so whoever can write there could run code as you; compiled kernels are kept "
                  f"in memory for this process only. Point JITGRAD_CACHE_DIR at a directory only you can write "
                  f"(jitgrad makes a new one private), take group and other write permission away from this "
                  f"one if it is meant to be yours alone (chmod go-w {folder}), or set JITGRAD_CACHE=0 to run "
                  f"without the disk cache.",
                  CacheWarning, stacklevel=3)


def usable(path: str) -> bool:
    return path not in _unusable


def mark_unusable(path: str, exc: OSError) -> None:
    """Stop writing to `path` for the rest of the process, warning the first time."""
    with _lock:
        if path in _unusable:
            return
        _unusable.add(path)
    reason = exc.strerror or str(exc)
    warnings.warn(f"jitgrad cannot write its kernel cache at {path} ({reason}); compiled kernels are kept in "
                  f"memory for this process only. Point JITGRAD_CACHE_DIR at a writable directory, or set "
                  f"JITGRAD_CACHE=0 to run without the disk cache.", CacheWarning, stacklevel=2)


def _warn_setting(name: str, message: str) -> None:
    with _lock:
        if name in _warned_settings:
            return
        _warned_settings.add(name)
    warnings.warn(message, CacheWarning, stacklevel=3)


def max_bytes() -> int:
    """The size limit: `JITGRAD_CACHE_MAX_MB` megabytes (default 512)."""
    text = os.environ.get("JITGRAD_CACHE_MAX_MB")
    if text is None:
        return int(DEFAULT_MAX_MB * 2**20)
    try:
        megabytes = float(text)
        if megabytes < 0 or megabytes != megabytes:
            raise ValueError(text)
    except ValueError:
        _warn_setting("max_mb", f"JITGRAD_CACHE_MAX_MB={text!r} is not a number of megabytes >= 0; using "
                                f"{DEFAULT_MAX_MB:g}")
        megabytes = DEFAULT_MAX_MB
    return int(megabytes * 2**20)


# ---------------------------------------------------------------------- files

def write_atomic(path: str, data: bytes) -> bool:
    """Write `data` to a temporary file beside `path` and rename it into place, so a reader sees the
    old file or the whole new one, never part. False (after the one warning) if the disk refuses."""
    folder = os.path.dirname(path)
    if not usable(folder):
        return False
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    try:
        try:
            fd = os.open(tmp, flags, _PRIVATE_FILE)
        except FileNotFoundError:  # the directory was removed (`cache clear` elsewhere): make it again
            os.makedirs(folder, mode=_PRIVATE_DIR, exist_ok=True)
            fd = os.open(tmp, flags, _PRIVATE_FILE)
    except OSError as exc:
        mark_unusable(folder, exc)
        return False
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        discard(tmp)
        mark_unusable(folder, exc)
        return False
    except BaseException:  # a KeyboardInterrupt mid-write: no temporary file is left behind
        discard(tmp)
        raise
    return True


def write_source(path: str, source: str) -> bool:
    """Make `path` hold exactly `source` (rewriting a missing, truncated or edited copy) and mark the
    entry as used now. False when the source is not there and cannot be written."""
    data = source.encode()
    folder = os.path.dirname(path)
    try:
        with open(path, "rb") as fh:
            found = fh.read()
    except FileNotFoundError:
        found = None
    except OSError as exc:
        log.warning("cannot read %s (%s); rewriting it", path, exc)
        found = None
    if found == data:
        if usable(folder):
            try:
                os.utime(path)  # the entry's last use, for eviction
            except FileNotFoundError:  # evicted by another process just now: write it again
                return write_atomic(path, data)
            except OSError as exc:
                mark_unusable(folder, exc)  # a read-only directory: its entries still load
        return True
    if found is not None:
        log.warning("kernel source %s did not match its hash (corrupted or edited); rewriting it", path)
    return write_atomic(path, data)


def write_entry(path: str, key: str, payload: bytes) -> bool:
    """Store `key` and `payload` behind a magic number and their SHA-256, so `read_entry` can tell the
    file is whole and is the entry of the key it looks up, whatever its name."""
    encoded = key.encode()
    body = len(encoded).to_bytes(_KEY_LENGTH_BYTES, "big") + encoded + payload
    return write_atomic(path, _MAGIC + hashlib.sha256(body).digest() + body)


def read_entry(path: str, key: str) -> bytes | None:
    """The payload stored at `path` for `key`; None if there is no file. A file that is damaged,
    holds another key's entry, or that someone other than this user or root could have written is
    logged as a warning, deleted (the caller rebuilds it) and raises `EntryRejected`."""
    try:
        with open(path, "rb") as fh:
            problem = ownership_problem(os.fstat(fh.fileno()))
            if problem is not None:
                _reject(path, f"is not trusted: {problem}")
            data = fh.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        _reject(path, f"cannot be read ({exc.strerror or exc})")
    head = len(_MAGIC) + _DIGEST_BYTES
    body = data[head:]
    if (len(data) < head + _KEY_LENGTH_BYTES or data[:len(_MAGIC)] != _MAGIC
            or hashlib.sha256(body).digest() != data[len(_MAGIC):head]):
        _reject(path, f"is corrupted ({len(data)} bytes, checksum mismatch)")
    key_end = _KEY_LENGTH_BYTES + int.from_bytes(body[:_KEY_LENGTH_BYTES], "big")
    stored = body[_KEY_LENGTH_BYTES:key_end]
    if stored != key.encode():
        _reject(path, f"holds the entry of another key (copied or renamed over this file): "
                      f"{_difference(stored.decode(errors='replace'), key)}")
    return body[key_end:]


def load_entry(path: str, key: str, decode: Callable[[bytes], Any], rejected: Callable[[], None], instead: str) -> Any:
    """`decode` of the payload stored at `path` for `key`, or None: no file, or one refused (`read_entry`) or that
    does not decode (logged with what the caller does `instead`, and deleted); `rejected()` counts the last two."""
    try:
        payload = read_entry(path, key)
    except EntryRejected:
        rejected()
        return None
    if payload is None:
        return None
    try:
        return decode(payload)
    except Exception as exc:  # a whole entry that does not load (a class renamed since): rebuild it
        log.warning("cannot load %s (%s: %s); %s", path, type(exc).__name__, exc, instead)
        discard(path)
        rejected()
        return None


def _difference(stored: str, wanted: str, context: int = 60) -> str:
    """Where two keys first differ, with a little of each around that point."""
    at = next((i for i, (a, b) in enumerate(zip(stored, wanted)) if a != b), min(len(stored), len(wanted)))
    start = max(0, at - context // 2)
    return (f"from character {at} the file holds {stored[start:start + context]!r}, "
            f"the key looked up is {wanted[start:start + context]!r}")


def _reject(path: str, problem: str) -> NoReturn:
    """Log, delete and refuse one machine code file."""
    log.warning("cache entry %s %s; discarding it and recompiling", path, problem)
    discard(path)
    raise EntryRejected(f"{path} {problem}")


def touch(path: str) -> None:
    """Mark an entry file as used now (its modification time orders eviction), where the disk allows."""
    try:
        os.utime(path)
    except OSError:
        pass


def discard(path: str) -> None:
    """Remove one file, ignoring one that is already gone or cannot be removed."""
    try:
        os.unlink(path)
    except OSError:
        pass


# ---------------------------------------------------------------------- entries, eviction, info

@dataclass
class Entry:
    """All files of one kernel: its source and machine code of each compiled signature."""

    folder: str
    stem: str
    files: list[str] = field(default_factory=list)
    size: int = 0
    last_used: float = 0.0


def _version_dirs(base: str) -> list[str]:
    """jitgrad's version directories under `base` (nothing else there is ever touched)."""
    try:
        return sorted(e.path for e in os.scandir(base)
                      if e.name.startswith("jitgrad-") and e.is_dir(follow_symlinks=False))
    except OSError:
        return []


def scan(folder: str) -> dict[str, Entry]:
    """The kernel entries in one version directory, by stem."""
    entries: dict[str, Entry] = {}
    try:
        listing = list(os.scandir(folder))
    except OSError:
        return entries
    for item in listing:
        if not item.name.startswith((ENTRY_PREFIX, PROGRAM_PREFIX)):
            continue
        try:
            st = item.stat(follow_symlinks=False)
        except OSError:
            continue
        stem = item.name.split(".", 1)[0]
        entry = entries.setdefault(stem, Entry(folder, stem))
        entry.files.append(item.path)
        entry.size += st.st_size
        entry.last_used = max(entry.last_used, st.st_mtime)
    return entries


def all_entries(base: str | None = None) -> list[Entry]:
    """Entries of every version directory under the base (old versions' entries count towards the
    limit and are the first to go, since nothing uses them any more)."""
    base = base_dir() if base is None else base
    return [e for folder in _version_dirs(base) for e in scan(folder).values()]


def enforce_limit(keep: str = "", limit: int | None = None) -> list[str]:
    """Evict least-recently-used entries until the cache fits its size limit; never the entry
    `keep` (the one just written). Returns the evicted stems."""
    limit = max_bytes() if limit is None else limit
    entries = all_entries()
    total = sum(e.size for e in entries)
    evicted = []
    for entry in sorted(entries, key=lambda e: e.last_used):
        if total <= limit:
            break
        if entry.stem == keep:
            continue
        for path in entry.files:
            discard(path)
        total -= entry.size
        evicted.append(entry.stem)
        log.info("evicted kernel %s (%d bytes, last used %s) to keep the cache under %d MB", entry.stem,
                 entry.size, time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.last_used)), limit // 2**20)
    return evicted


@dataclass
class VersionInfo:
    """One version directory's kernels, compiled signatures and bytes, for `cache info`."""

    name: str
    entries: int
    compiled: int
    size: int
    current: bool
    programs: int = 0  # compiled programs (`jitgrad.runtime.programs`), counted in `size`, not in `entries`


def info() -> dict:
    """Location, settings and contents (per version directory) of the cache, for `python -m jitgrad cache info`."""
    base = base_dir()
    versions = []
    for folder in _version_dirs(base):
        entries = scan(folder).values()
        compiled = sum(f.endswith(".nbk") for e in entries for f in e.files)
        programs = sum(e.stem.startswith(PROGRAM_PREFIX) for e in entries)
        versions.append(VersionInfo(os.path.basename(folder), len(entries) - programs, compiled,
                                    sum(e.size for e in entries), os.path.basename(folder) == version_tag(), programs))
    return {"location": base, "enabled": enabled(), "current": version_tag(), "max_bytes": max_bytes(),
            "versions": versions, "entries": sum(v.entries for v in versions),
            "size": sum(v.size for v in versions), "refused": _refusal(base)}


def _refusal(base: str) -> str | None:
    """Why a process would refuse the existing base or current version directory, or None."""
    for folder in (base, os.path.join(base, version_tag())):
        if os.path.isdir(folder):
            problem = trust_problem(folder)
            if problem is not None:
                return f"{folder}: {problem}"
    return None


def clear() -> tuple[int, int]:
    """Delete every kernel and program entry under the base directory (only jitgrad's own files, and version
    directories left empty). Returns (kernel entries removed, bytes freed)."""
    removed = freed = 0
    for folder in _version_dirs(base_dir()):
        for entry in scan(folder).values():
            for path in entry.files:
                discard(path)
            removed += entry.stem.startswith(ENTRY_PREFIX)
            freed += entry.size
        try:
            os.rmdir(folder)
        except OSError:
            pass
    return removed, freed
