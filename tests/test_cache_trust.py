"""The disk cache cannot be tricked: entry files copied or swapped between kernels are recompiled,
never run as the other kernel, and a cache directory or file that another user could have written
is never loaded (one warning, then kernels in memory only). Real processes, real directories."""
import itertools
import json
import os
import shutil
import stat
import subprocess
import sys

import numpy as np
import pytest

from jitgrad import cache

# A fresh process computing sum(f(x)) for each numpy function named on its command line (64 float64
# elements: serial kernels only, one kernel and one signature per function, all of the same
# argument types). It prints each result's relative error against numpy, the machine code files
# each function's first call added, and the compiler's counters.
CHILD = r"""
import json, os, sys
import numpy as np
import jitgrad as jg
from jitgrad.kernels.build import compiler

folder = os.environ["JITGRAD_CACHE_DIR"]

def machine_code():
    return {os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs if f.endswith(".nbk")}

def summed(f):
    return jg.trace(lambda a: np.sum(f(a)))

x = np.linspace(0.1, 1.0, 64)
errors, added = {}, {}
for name in sys.argv[1:]:
    before = machine_code()
    f = getattr(np, name)
    errors[name] = abs(float(summed(f)(x)) / float(np.sum(f(x))) - 1)
    added[name] = sorted(os.path.relpath(p, folder) for p in machine_code() - before)
compiler.wait_for_background_compiles()
print(json.dumps({"errors": errors, "added": added, "stats": compiler.stats()}))
"""

FUNCTIONS = ("sin", "cos", "exp", "tanh", "arctan")
NOBODY = 65534


def run_child(folder, *functions, **env):
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("JITGRAD_", "JG_"))}
    environ.update({"JITGRAD_CACHE_DIR": str(folder), "JITGRAD_FIRST_CALL": "compiled"}, **env)  # kernels from call 1
    proc = subprocess.run([sys.executable, "-c", CHILD, *functions], env=environ, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(error < 1e-12 for error in result["errors"].values()), result  # never another kernel's number
    result["stderr"] = proc.stderr
    return result


def snapshot(folder):
    """Every file under `folder` with its bytes, owner, mode and modification time."""
    found = {}
    for d, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(d, name)
            st = os.stat(path)
            found[os.path.relpath(path, folder)] = (open(path, "rb").read(), st.st_uid, stat.S_IMODE(st.st_mode),
                                                    st.st_mtime_ns)
    return found


@pytest.fixture(scope="module")
def populated(tmp_path_factory):
    """A cache filled by one cold process, and the machine code file of each function's kernel."""
    folder = tmp_path_factory.mktemp("trust") / "cache"
    result = run_child(folder, *FUNCTIONS)
    assert result["stats"]["builds"] == len(FUNCTIONS) and result["stats"]["disk_writes"] == len(FUNCTIONS)
    entries = {}
    for name, files in result["added"].items():
        assert len(files) == 1 and ".serial_kernel." in files[0], result["added"]  # one entry, same kind for all
        entries[name] = files[0]
    assert len(set(entries.values())) == len(FUNCTIONS)
    return folder, entries


@pytest.fixture
def warm(populated, tmp_path):
    """A private copy of the populated cache."""
    folder = tmp_path / "cache"
    shutil.copytree(populated[0], folder)
    return folder, populated[1]


def _source_of(entry: str) -> str:
    folder, name = os.path.split(entry)
    return os.path.join(folder, name.split(".", 1)[0] + ".py")


def swap(folder, first: str, second: str) -> None:
    """Exchange two kernels' files (machine code and source) under each other's names."""
    for a, b in ((first, second), (_source_of(first), _source_of(second))):
        data_a, data_b = (folder / a).read_bytes(), (folder / b).read_bytes()
        (folder / a).write_bytes(data_b)
        (folder / b).write_bytes(data_a)


def round_robin(n: int) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint pairs that together pair every one of `n` items with every other once."""
    seats = list(range(n)) + ([None] if n % 2 else [])
    rounds = []
    for _ in range(len(seats) - 1):
        pairs = [(seats[i], seats[-1 - i]) for i in range(len(seats) // 2)]
        rounds.append([tuple(sorted(p)) for p in pairs if None not in p])
        seats = [seats[0], seats[-1], *seats[1:-1]]
    return rounds


ROUNDS = round_robin(len(FUNCTIONS))


def test_the_rounds_swap_every_pair_once() -> None:
    pairs = [pair for r in ROUNDS for pair in r]
    assert sorted(pairs) == sorted(itertools.combinations(range(len(FUNCTIONS)), 2))


def test_an_entry_copied_over_another_kernels_is_recompiled(warm) -> None:
    folder, entries = warm
    (folder / entries["cos"]).write_bytes((folder / entries["sin"]).read_bytes())  # cos's file holds sin's code
    result = run_child(folder, *FUNCTIONS, JITGRAD_LOG="cache")  # run_child checks cos is cos
    stats = result["stats"]
    assert stats["disk_rejected"] == 1 and stats["builds"] == 1 and stats["disk_hits"] == len(FUNCTIONS) - 1
    assert stats["disk_writes"] == 1 and stats["signatures"] == stats["numba_compiles"] == len(FUNCTIONS)
    assert "holds the entry of another key" in result["stderr"] and entries["cos"] in result["stderr"]
    again = run_child(folder, *FUNCTIONS)  # the rebuilt entry is cos's own
    assert again["stats"]["builds"] == 0 and again["stats"]["disk_hits"] == len(FUNCTIONS)


@pytest.mark.parametrize("pairs", ROUNDS, ids=lambda r: ",".join(f"{FUNCTIONS[a]}<->{FUNCTIONS[b]}" for a, b in r))
def test_swapping_entries_of_the_same_kind_never_changes_a_result(warm, pairs) -> None:
    folder, entries = warm
    for a, b in pairs:
        swap(folder, entries[FUNCTIONS[a]], entries[FUNCTIONS[b]])
    result = run_child(folder, *FUNCTIONS)  # run_child checks every result against numpy
    swapped = 2 * len(pairs)
    stats = result["stats"]
    assert stats["disk_rejected"] == swapped and stats["builds"] == swapped
    assert stats["disk_hits"] == len(FUNCTIONS) - swapped


def test_new_directories_are_private(tmp_path) -> None:
    base = tmp_path / "parent" / "jitgrad"
    run_child(base, "sin")
    version = base / cache.version_tag()
    assert stat.S_IMODE(base.stat().st_mode) == 0o700 and stat.S_IMODE(version.stat().st_mode) == 0o700
    modes = {name: mode for name, (_, _, mode, _) in snapshot(base).items()}
    assert len(modes) == 4 and set(modes.values()) == {0o600}, modes  # source, machine and module code, program


def _as_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _make_untrusted(folder, version, where: str, how: str) -> str:
    """Open `where` (the base or version directory) to others by `how`; returns the directory."""
    target = folder if where == "base" else version
    if how == "group-writable":
        target.chmod(0o770)
    elif how == "world-writable":
        target.chmod(0o1777)
    else:
        os.chown(target, NOBODY, NOBODY)
    return str(target)


ROOT_ONLY = pytest.mark.skipif(not _as_root(), reason="giving a file or directory to another user needs root")
UNTRUSTED = [pytest.param("base", "group-writable", "its group can write it (mode 770)", id="base-group-writable"),
             pytest.param("version", "world-writable", "its group and other users can write it (mode 1777)",
                          id="version-world-writable"),
             pytest.param("base", "owned by nobody", f"it is owned by uid {NOBODY}", id="base-owned-by-nobody",
                          marks=ROOT_ONLY),
             pytest.param("version", "owned by nobody", f"it is owned by uid {NOBODY}", id="version-owned-by-nobody",
                          marks=ROOT_ONLY)]


@pytest.mark.parametrize("where, how, reason", UNTRUSTED)
def test_a_directory_others_could_write_is_neither_loaded_nor_written(warm, where, how, reason) -> None:
    folder, _ = warm
    version = folder / cache.version_tag()
    target = _make_untrusted(folder, version, where, how)
    before = snapshot(folder)
    result = run_child(folder, *FUNCTIONS)
    warnings_seen = [line for line in result["stderr"].splitlines() if "CacheWarning" in line]
    assert len(warnings_seen) == 1, result["stderr"]
    assert f"will not use its kernel cache at {target}: {reason}" in warnings_seen[0]
    assert "kept in memory for this process only" in warnings_seen[0]
    stats = result["stats"]
    assert stats["builds"] == len(FUNCTIONS) and stats["disk_hits"] == 0 and stats["disk_writes"] == 0
    assert snapshot(folder) == before  # nothing written, replaced or touched (not even a last-use time)
    environ = dict(os.environ, JITGRAD_CACHE_DIR=str(folder))
    info = subprocess.run([sys.executable, "-m", "jitgrad", "cache", "info"], env=environ, capture_output=True,
                          text=True, timeout=120)
    assert info.returncode == 0 and f"refused: {target}: {reason}" in info.stdout, info


ENTRY_PROBLEMS = [pytest.param("writable by others", "other users can write it (mode 602)", id="writable-by-others"),
                  pytest.param("owned by nobody", f"it is owned by uid {NOBODY}", id="owned-by-nobody",
                               marks=ROOT_ONLY)]


@pytest.mark.parametrize("how, reason", ENTRY_PROBLEMS)
def test_an_entry_file_another_user_could_have_written_is_rebuilt(warm, how, reason) -> None:
    folder, entries = warm
    path = folder / entries["exp"]
    if how == "writable by others":
        path.chmod(0o602)
    else:
        os.chown(path, NOBODY, NOBODY)
    result = run_child(folder, *FUNCTIONS, JITGRAD_LOG="cache")
    stats = result["stats"]
    assert stats["disk_rejected"] == 1 and stats["builds"] == 1 and stats["disk_hits"] == len(FUNCTIONS) - 1
    assert f"{path} is not trusted: {reason}" in result["stderr"]
    st = path.stat()  # replaced by this user's own entry
    assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o600


def test_read_entry_checks_key_checksum_and_owner(tmp_path) -> None:
    path = str(tmp_path / (cache.ENTRY_PREFIX + "k.f.1.nbk"))
    payload = np.random.default_rng(0).bytes(1000)
    assert cache.write_entry(path, "key of k", payload)
    assert cache.read_entry(path, "key of k") == payload
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with pytest.raises(cache.EntryRejected, match="holds the entry of another key"):
        cache.read_entry(path, "key of m")
    assert not os.path.exists(path) and cache.read_entry(path, "key of m") is None
    assert cache.write_entry(path, "key of k", payload)
    os.chmod(path, 0o620)
    with pytest.raises(cache.EntryRejected, match=r"its group can write it \(mode 620\)"):
        cache.read_entry(path, "key of k")
    assert not os.path.exists(path)


def test_nothing_is_made_inside_a_refused_base(tmp_path) -> None:
    folder = tmp_path / "cache"
    folder.mkdir()
    folder.chmod(0o777)
    result = run_child(folder, "sin", "cos")
    assert result["stderr"].count("CacheWarning") == 1 and "other users can write it (mode 777)" in result["stderr"]
    assert list(folder.iterdir()) == []
    assert result["stats"]["builds"] == 2 and result["stats"]["disk_writes"] == 0
