"""The persistent kernel cache across processes: sharing one directory, damaged entries, a read-only
or full disk, a different CPU, turning it off, the size limit, the command line, the key, and the
compiler's counters (tests/test_cache_trust.py: swapped entries and directories others can write)."""
import errno
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from jitgrad import cache
from jitgrad.kernels.build import compiler, source_keys

# A fresh process computing the core example's value-and-grad and forward; it prints its error
# against numpy and the compiler's counters. JG_DENY="<errno>:<text>" makes every write to a path
# containing <text> fail with that errno (the kernel's answer for a read-only directory or a full
# disk, which root, who ignores permission bits, would otherwise never get).
CHILD = r"""
import json, os, sys
deny = os.environ.get("JG_DENY")
if deny:
    code, needle = deny.split(":", 1)
    real_open, real_mkdir = os.open, os.mkdir

    def refuse(path):
        raise OSError(int(code), os.strerror(int(code)), os.fspath(path))

    def checked_open(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and needle in os.fspath(path):
            refuse(path)
        return real_open(path, flags, *args, **kwargs)

    def checked_mkdir(path, *args, **kwargs):
        if needle in os.fspath(path):
            refuse(path)
        return real_mkdir(path, *args, **kwargs)

    os.open, os.mkdir = checked_open, checked_mkdir
import numpy as np
import jitgrad as jg
from jitgrad.kernels.build import compiler
if os.environ.get("JG_PROGRESS_S"):
    compiler.PROGRESS_INTERVAL_S = float(os.environ["JG_PROGRESS_S"])

def loss(w, x, b):
    return np.sum(np.exp(w * x + b) * 2 + np.tanh(x))

n = int(os.environ.get("JG_N", "300000"))
rng = np.random.default_rng(0)
w, x, b = (rng.random(n).astype(np.float32) for _ in range(3))
f = jg.trace(loss)
value, grads = f.value_and_grad(w, x, b, argnums=(0, 1, 2))
forward = f(w, x, b)
w64, x64, b64 = (a.astype(np.float64) for a in (w, x, b))
e = np.exp(w64 * x64 + b64) * 2
ref_value = np.sum(e + np.tanh(x64))
ref_grads = (e * x64, e * w64 + 1 - np.tanh(x64) ** 2, e)
errors = [abs(value / ref_value - 1), abs(forward / ref_value - 1)]
errors += [float(np.max(np.abs(g / r - 1))) for g, r in zip(grads, ref_grads)]
compiler.wait_for_background_compiles()
from jitgrad.runtime import programs
print(json.dumps({"error": max(errors), "stats": compiler.stats(), "programs": programs.stats()}))
"""

PARALLEL_N = "300000"  # above the parallel threshold: both variants of the 2 kernels, 4 signatures, are cached
SMALL_N = "64"  # serial kernels only: quicker to compile


def run_child(folder, n=PARALLEL_N, wait=True, **env):
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("JITGRAD_", "JG_"))}
    # The child counts the builds it makes itself, and its simulated failures (JG_DENY) are patched into it
    # alone: a compile helper it started would build some kernels and write where the child may not.
    environ.update({"JITGRAD_CACHE_DIR": str(folder), "JG_N": n, "JITGRAD_COMPILE_HELPER": "0",
                    "JITGRAD_FIRST_CALL": "compiled"}, **env)  # the kernels' cache is under test from the first call
    proc = subprocess.Popen([sys.executable, "-c", CHILD], env=environ, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return finish(proc) if wait else proc


def finish(proc):
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["error"] < 1e-5, result
    result["stderr"] = err
    return result


def files(folder):
    return sorted(os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs)


@pytest.fixture(scope="module")
def populated(tmp_path_factory):
    """A cache directory filled by one cold process (with compile logging and fast progress ticks)."""
    folder = tmp_path_factory.mktemp("populated")
    result = run_child(folder, JITGRAD_LOG="compile", JG_PROGRESS_S="0.05")
    return folder, result


def test_cold_process_compiles_logs_and_writes_entries(populated) -> None:
    folder, result = populated
    stats = result["stats"]
    assert stats["sources"] == 2 and stats["builds"] == 4 and stats["disk_hits"] == 0 and stats["disk_writes"] == 4
    assert stats["signatures"] == stats["numba_compiles"] == 4 and stats["disk_rejected"] == 0
    compiled_lines = [l for l in result["stderr"].splitlines() if "INFO compiled kernel" in l]
    assert len(compiled_lines) == 4 and all(l.endswith(" s") for l in compiled_lines), result["stderr"]
    assert "still compiling kernel" in result["stderr"]
    names = files(folder)
    prefixes = tuple(cache.version_tag() + os.sep + p for p in (cache.ENTRY_PREFIX, cache.PROGRAM_PREFIX))
    assert all(name.startswith(prefixes) for name in names), names
    assert sum(n.endswith(".py") for n in names) == 2 and sum(n.endswith(".nbk") for n in names) == 4
    assert sum(n.endswith(".jgc") for n in names) == 2  # each kernel's module code
    assert sum(n.endswith(".jgp") for n in names) == 2  # the value-and-grad and the call programs
    assert result["programs"]["program_misses"] == result["programs"]["program_writes"] == 2


def test_warm_process_loads_everything_from_disk(populated, tmp_path) -> None:
    folder = tmp_path / "cache"
    shutil.copytree(populated[0], folder)
    result = run_child(folder, JITGRAD_LOG="compile")
    stats = result["stats"]
    assert stats["builds"] == 0 and stats["disk_hits"] == 4 and stats["disk_writes"] == 0
    assert stats["signatures"] == stats["numba_compiles"] == 4 and stats["disk_rejected"] == 0  # loads are no builds
    assert "compiled kernel" not in result["stderr"]
    assert result["programs"]["program_hits"] == 2 and result["programs"]["program_misses"] == 0  # nor derived


def test_two_processes_compiling_into_one_directory_at_once(tmp_path) -> None:
    procs = [run_child(tmp_path, wait=False) for _ in range(2)]
    results = [finish(p) for p in procs]  # both correct (finish checks the error)
    assert all(r["stats"]["builds"] + r["stats"]["disk_hits"] == 4 for r in results), results
    warm = run_child(tmp_path)
    assert warm["stats"]["builds"] == 0 and warm["stats"]["disk_hits"] == 4, (results, warm)
    assert not [f for f in files(tmp_path) if ".tmp-" in f]


def test_damaged_entries_are_detected_and_rebuilt(populated, tmp_path) -> None:
    folder = tmp_path / "cache"
    shutil.copytree(populated[0], folder)
    version = folder / cache.version_tag()
    sources = sorted(version.glob("*.py"))
    machine = sorted(version.glob("*.nbk"))
    sources[0].write_text(sources[0].read_text()[:40])  # a half-written source
    machine[0].write_bytes(b"garbage")  # not an entry at all
    data = bytearray(machine[1].read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte inside the machine code: same size, wrong checksum
    machine[1].write_bytes(bytes(data))
    result = run_child(folder, JITGRAD_LOG="cache")
    assert result["stats"]["builds"] == 2 and result["stats"]["disk_hits"] == 2 and result["stats"]["disk_rejected"] == 2
    assert result["stderr"].count("is corrupted") == 2 and "did not match its hash" in result["stderr"]
    again = run_child(folder)
    assert again["stats"]["builds"] == 0 and again["stats"]["disk_hits"] == 4


def test_another_cpu_never_loads_this_cpus_code(populated, tmp_path) -> None:
    folder = tmp_path / "cache"
    shutil.copytree(populated[0], folder)
    generic = run_child(folder, NUMBA_CPU_NAME="generic")
    assert generic["stats"]["builds"] == 4 and generic["stats"]["disk_hits"] == 0
    assert len(list((folder / cache.version_tag()).glob("*.nbk"))) == 8  # both CPUs' code side by side
    native = run_child(folder)
    assert native["stats"]["builds"] == 0


@pytest.mark.parametrize("what, code, needle", [("read-only directory", errno.EACCES, ""),
                                                ("disk full while saving machine code", errno.ENOSPC, ".nbk")])
def test_unwritable_cache_degrades_to_memory_with_one_warning(tmp_path, what, code, needle) -> None:
    folder = tmp_path / "cache"
    folder.mkdir()
    if needle:  # a full disk, emulated for every user
        env = {"JG_DENY": f"{code}:{needle}"}
    else:  # root ignores mode bits: then the child's OS calls refuse as the kernel would for anyone else
        folder.chmod(0o555)
        env = {"JG_DENY": f"{code}:{folder}"} if os.access(folder, os.W_OK) else {}
    try:
        result = run_child(folder, n=SMALL_N, **env)
    finally:
        folder.chmod(0o755)
    assert result["stderr"].count("CacheWarning") == 1, result["stderr"]
    assert "kept in memory for this process only" in result["stderr"]
    assert result["stats"]["builds"] == 2 and result["stats"]["disk_writes"] == 0
    assert not [f for f in files(folder) if f.endswith(".nbk") or ".tmp-" in f]


def test_read_only_cache_still_serves_its_entries(populated, tmp_path) -> None:
    folder = tmp_path / "cache"
    shutil.copytree(populated[0], folder)
    version = folder / cache.version_tag()
    sorted(version.glob("*.nbk"))[0].unlink()  # one kernel must compile: its write is refused
    version.chmod(0o555)
    env = {"JG_DENY": f"{errno.EROFS}:{version}"} if os.access(version, os.W_OK) else {}
    try:
        result = run_child(folder, **env)
    finally:
        version.chmod(0o755)
    assert result["stats"]["disk_hits"] == 3 and result["stats"]["builds"] == 1
    assert result["stats"]["disk_writes"] == 0 and result["stderr"].count("CacheWarning") == 1


def test_cache_off_writes_nothing(tmp_path) -> None:
    result = run_child(tmp_path, n=SMALL_N, JITGRAD_CACHE="0")
    assert result["stats"]["builds"] == 2 and result["stats"]["disk_hits"] == 0
    assert files(tmp_path) == []


def _run_cli(folder, *args):
    environ = dict(os.environ, JITGRAD_CACHE_DIR=str(folder))
    proc = subprocess.run([sys.executable, "-m", "jitgrad", *args], env=environ, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_command_line_info_and_clear(populated, tmp_path) -> None:
    folder = tmp_path / "cache"
    shutil.copytree(populated[0], folder)
    (folder / "notes.txt").write_text("not jitgrad's")
    info = _run_cli(folder, "cache", "info")
    assert f"location: {folder}" in info and "in 2 kernel(s)" in info and "4 compiled signature(s)" in info
    assert "<- current" in info
    cleared = _run_cli(folder, "cache", "clear")
    assert cleared.startswith("removed 2 kernel(s)")
    assert files(folder) == ["notes.txt"]
    assert "in 0 kernel(s)" in _run_cli(folder, "cache", "info")


def _fake_entry(folder, stem, sizes, age_s):
    paths = []
    for suffix, size in sizes.items():
        path = folder / f"{cache.ENTRY_PREFIX}{stem}{suffix}"
        path.write_bytes(b"x" * size)
        os.utime(path, (time.time() - age_s, time.time() - age_s))
        paths.append(path)
    return paths


def test_least_recently_used_entries_are_evicted_first(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("JITGRAD_CACHE_DIR", str(tmp_path))
    current = tmp_path / cache.version_tag()
    old_version = tmp_path / "jitgrad-0.0.1-numba-0.1.0-py30"
    current.mkdir()
    old_version.mkdir()
    stale = _fake_entry(old_version, "stale", {".py": 100, ".f.1.nbk": 4000}, age_s=9000)
    oldest = _fake_entry(current, "oldest", {".py": 100, ".f.1.nbk": 4000}, age_s=3000)
    middle = _fake_entry(current, "middle", {".py": 100, ".f.1.nbk": 4000, ".f.2.nbk": 4000}, age_s=2000)
    newest = _fake_entry(current, "newest", {".py": 100, ".f.1.nbk": 4000}, age_s=1000)
    kept = _fake_entry(current, "written", {".py": 100, ".f.1.nbk": 4000}, age_s=5000)
    other = current / "unrelated.bin"
    other.write_bytes(b"y" * 10000)
    evicted = cache.enforce_limit(keep=cache.ENTRY_PREFIX + "written", limit=16300)
    assert evicted == [cache.ENTRY_PREFIX + "stale", cache.ENTRY_PREFIX + "oldest"]
    assert not any(p.exists() for p in stale + oldest)
    assert all(p.exists() for p in middle + newest + kept) and other.exists()
    assert cache.enforce_limit(limit=0) == [cache.ENTRY_PREFIX + s for s in ("written", "middle", "newest")]


def test_size_limit_setting(monkeypatch) -> None:
    monkeypatch.setenv("JITGRAD_CACHE_MAX_MB", "1.5")
    assert cache.max_bytes() == int(1.5 * 2**20)
    monkeypatch.setenv("JITGRAD_CACHE_MAX_MB", "lots")
    monkeypatch.setattr(cache, "_warned_settings", set())
    with pytest.warns(cache.CacheWarning, match="JITGRAD_CACHE_MAX_MB='lots' is not a number of megabytes"):
        assert cache.max_bytes() == int(cache.DEFAULT_MAX_MB * 2**20)


def test_location_follows_the_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("JITGRAD_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.base_dir() == str(tmp_path / "xdg" / "jitgrad")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.base_dir() == str(tmp_path / "home" / ".cache" / "jitgrad")
    monkeypatch.setenv("JITGRAD_CACHE_DIR", str(tmp_path / "mine"))
    assert cache.base_dir() == str(tmp_path / "mine")
    monkeypatch.setenv("JITGRAD_CACHE", "0")
    assert cache.directory() is None


class _Codegen:
    def __init__(self, cpu_name: str):
        self.cpu_name = cpu_name

    def magic_tuple(self):
        return ("x86_64-unknown-linux-gnu", self.cpu_name, "+avx2")


def test_key_covers_code_helpers_versions_signature_options_and_cpu(monkeypatch) -> None:
    import importlib.metadata
    import numba

    tag = cache.version_tag()
    assert importlib.metadata.version("jitgrad") in tag and numba.__version__ in tag
    assert f"py{sys.version_info.major}{sys.version_info.minor}" in tag

    plain = "def f(x):\n    return x\n"
    with_helper = "from jitgrad.kernels.cpu.vecmath import vexp\n" + plain
    assert source_keys.helper_modules(with_helper) == ("jitgrad.kernels.cpu.vecmath",)
    before = source_keys.source_key(with_helper)
    monkeypatch.setitem(source_keys._module_digests, "jitgrad.kernels.cpu.vecmath", b"an edited vecmath.py")
    assert source_keys.source_key(with_helper) != before  # editing a helper the kernel inlines changes its key
    assert source_keys.source_key(plain) != source_keys.source_key(plain + " ")

    disk = compiler.DiskCache("/c", "jitgrad_kernel_k", "serial_kernel", {})
    sig = (numba.int64, numba.float32[::1])
    key = disk.entry_key(sig, _Codegen("skylake"))
    assert all(part in key for part in (tag, "jitgrad_kernel_k.serial_kernel", str(sig), "skylake"))
    base = disk.entry_path(sig, _Codegen("skylake"))
    assert base == disk.entry_path(sig, _Codegen("skylake"))
    assert base != disk.entry_path((numba.int64, numba.float64[::1]), _Codegen("skylake"))
    assert base != disk.entry_path((numba.int64, numba.float32[:]), _Codegen("skylake"))  # layout
    assert base != disk.entry_path(sig, _Codegen("znver3"))
    parallel = compiler.DiskCache("/c", "jitgrad_kernel_k", "serial_kernel", {"parallel": True})
    assert base != parallel.entry_path(sig, _Codegen("skylake"))


def test_entry_files_detect_every_truncation(tmp_path) -> None:
    path = str(tmp_path / (cache.ENTRY_PREFIX + "k.f.1.nbk"))
    payload = np.random.default_rng(0).bytes(1000)
    assert cache.write_entry(path, "key", payload)
    assert cache.read_entry(path, "key") == payload
    whole = open(path, "rb").read()
    for cut in (0, 3, 36, 39, 40, len(whole) // 2, len(whole) - 1):
        with open(path, "wb") as fh:
            fh.write(whole[:cut])
        with pytest.raises(cache.EntryRejected, match="is corrupted"):
            cache.read_entry(path, "key")
        assert not os.path.exists(path)
    assert cache.read_entry(path, "key") is None  # no file: a plain miss


def test_a_directory_cleared_by_another_process_is_made_again(tmp_path) -> None:
    folder = tmp_path / "version"
    folder.mkdir()
    path = str(folder / (cache.ENTRY_PREFIX + "k.py"))
    assert cache.write_source(path, "x = 1\n")
    shutil.rmtree(folder)  # `python -m jitgrad cache clear` running elsewhere
    assert cache.write_source(path, "x = 1\n") and open(path).read() == "x = 1\n"
    assert cache.usable(str(folder))
