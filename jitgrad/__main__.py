"""Command line: `python -m jitgrad cache info`, `python -m jitgrad cache clear`,
`python -m jitgrad explain module:function --shapes "f32[1000],f32[1000]"`, and `python -m jitgrad ops [NAME]`
(is a numpy function supported under tracing, its gradient convention, the keywords it refuses, what to write
instead; without NAME, every supported op).

Each command is a subparser with its own handler (`set_defaults(run=...)`), so adding one is one
more `add_parser` call.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from jitgrad import cache, opinfo
from jitgrad.front import explain
from jitgrad.front.api import Traced, trace
from jitgrad.errors import JitgradError


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MB" if n >= 2**20 else f"{n / 2**10:.1f} kB"


def cache_info(_: argparse.Namespace) -> int:
    facts = cache.info()
    state = "on" if facts["enabled"] else "off (JITGRAD_CACHE=0)"
    print(f"location: {facts['location']}")
    print(f"cache: {state}; this installation uses {facts['current']}/")
    if facts["refused"]:
        print(f"refused: {facts['refused']}; kernels are compiled in memory only until it is fixed "
              f"(see docs/caching.md, trust model)")
    print(f"size: {_size(facts['size'])} in {facts['entries']} kernel(s); limit {_size(facts['max_bytes'])} "
          f"(JITGRAD_CACHE_MAX_MB), least recently used evicted first")
    for v in facts["versions"]:
        mark = "  <- current" if v.current else ""
        print(f"  {v.name}: {v.entries} kernel(s), {v.compiled} compiled signature(s), {_size(v.size)}{mark}")
    return 0


def cache_clear(_: argparse.Namespace) -> int:
    removed, freed = cache.clear()
    print(f"removed {removed} kernel(s), {_size(freed)}, from {cache.base_dir()}")
    return 0


def explain_function(args: argparse.Namespace) -> int:
    """Print what `module:function` compiles to for arguments of the given dtypes and shapes."""
    try:
        target = explain.load_function(args.target)
        traced = target if isinstance(target, Traced) else trace(target)
        print(traced.explain(*explain.example_arrays(args.shapes), format=args.format))
    except (JitgradError, ImportError) as exc:
        print(f"python -m jitgrad explain: {exc}", file=sys.stderr)
        return 2
    return 0


def ops(args: argparse.Namespace) -> int:
    """What jitgrad traces: one op (`ptp`, `np.ptp`, `linalg.solve`, `jg.gelu`) or, without a name, all of them."""
    if not args.names:
        names = opinfo.supported_names()
        print(f"{len(names)} supported ops (np.<function>, np.<ufunc>[.method], jg.<jitgrad op>, x.<ndarray method>); "
              f"python -m jitgrad ops NAME says more about one:")
        print("\n".join(f"  {n}" for n in names))
        return 0
    found = [opinfo.describe(name) for name in args.names]
    print("\n\n".join("\n".join(info.lines()) for info in found))
    return 0 if all(info.exists for info in found) else 1


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m jitgrad", description="jitgrad command line tools")
    commands = top.add_subparsers(dest="command", required=True)
    cache_cmd = commands.add_parser("cache", help="the on-disk kernel cache")
    actions = cache_cmd.add_subparsers(dest="action", required=True)
    actions.add_parser("info", help="location, size, entries and limit").set_defaults(run=cache_info)
    actions.add_parser("clear", help="delete every cached kernel").set_defaults(run=cache_clear)
    explain_cmd = commands.add_parser("explain", help="forward/backward IR, saved values, fusion groups, kernel source")
    explain_cmd.add_argument("target", help="the function, as module:function (a jg.trace'd function or plain numpy)")
    explain_cmd.add_argument("--shapes", required=True, help='one dtype[dims] per argument, e.g. "f32[1000],f64[4,8]"')
    explain_cmd.add_argument("--format", choices=["text", "dot"], default="text", help="text, or Graphviz DOT")
    explain_cmd.set_defaults(run=explain_function)
    ops_cmd = commands.add_parser("ops", help="is a numpy function supported under tracing; its gradient convention, "
                                              "refused keywords, or what to write instead")
    ops_cmd.add_argument("names", nargs="*", metavar="NAME",
                         help="e.g. ptp, np.ptp, tanh, linalg.solve, jg.gelu, add.reduce; none: list the supported ops")
    ops_cmd.set_defaults(run=ops)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
