"""A compiled kernel signature as the payload of a disk-cache entry, and back (`DiskCache` in `compiler`).

numba's own cache stores a library as its object code and the LLVM bitcode of its module; a load parses
that bitcode (about 1.5 ms a kernel) and walks it for the names of the symbols it defines (about 1 ms)
before linking the object code. The bitcode only serves to link the library into another one, which no
generated kernel is; the names are what numba's engine checks before it looks a function up. A payload
here also holds those names, so a load links the object code and records the names without parsing
anything: the bitcode stays as bytes, parsed if numba ever asks for the module to link it. The same
object code is linked either way, so a kernel loaded this way runs the same machine code.

A kernel's module code is an entry too (`module_code`): the generated source compiled by Python (about 1.3 ms
a kernel) and marshalled, keyed on the source's hash, its file name and Python's bytecode magic number, so
a new process runs the module without compiling its source.
"""
from __future__ import annotations

import hashlib
import importlib.util
import marshal
import os
import pickle
import types
from typing import Any

import llvmlite.binding as ll
from numba.core import codegen as numba_codegen
from numba.core.compiler import CompileResult
from numba.core.serialize import dumps

from jitgrad import cache

FORMAT = "object-code+symbols-1"  # part of every entry's key: an entry of another form is another key


class LoadedLibrary(numba_codegen.JITCodeLibrary):
    """A kernel's library linked from its object code; its module for linking into another library is
    parsed from the stored bitcode on first request."""

    def __init__(self, codegen: Any, name: str, bitcode: bytes):
        super().__init__(codegen, name)
        self._bitcode = bitcode

    def _get_module_for_linking(self) -> Any:
        if self._shared_module is None:
            self._shared_module = ll.parse_bitcode(self._bitcode)
        return self._shared_module


def defined_symbols(module: Any) -> list[str]:
    """The functions and global variables `module` defines (not those it only declares), as numba's engine
    records them when it adds a module (`JitEngine._load_defined_symbols`)."""
    return sorted({g.name for group in (module.functions, module.global_variables) for g in group
                   if not g.is_declaration})


def payload(cres: CompileResult) -> bytes:
    """What an entry stores for `cres`: numba's reduction of it, its library as object code, bitcode and the
    names of the symbols it defines."""
    (name, kind, (object_code, bitcode)), *rest = cres._reduce()
    if kind != "object":
        raise ValueError(f"a kernel library serialised as {kind!r}, not as object code")
    symbols = defined_symbols(cres.library._get_module_for_linking())
    return dumps((name, object_code, bitcode, symbols, *rest))


def rebuild(target_context: Any, data: bytes) -> CompileResult:
    """The compile result an entry's payload holds, its object code linked into this process (numba's
    `CompileResult._rebuild`, without parsing the bitcode)."""
    (name, object_code, bitcode, symbols, fndesc, environment, signature, objectmode, lifted, typeann,
     reload_init, referenced_envs) = pickle.loads(data)
    for init in reload_init:
        init()
    codegen = target_context.codegen()
    library = LoadedLibrary(codegen, name, bitcode)
    library.enable_object_caching()
    library._set_compiled_object(object_code)
    library._finalize_final_module()  # adds the (empty) module: the engine links the object code for it
    codegen._engine._defined_symbols.update(symbols)
    entry_point = target_context.get_executable(library, fndesc, environment)
    cres = CompileResult(target_context=target_context, typing_context=target_context.typing_context,
                         library=library, environment=environment, entry_point=entry_point, fndesc=fndesc,
                         type_annotation=typeann, signature=signature, objectmode=objectmode, lifted=lifted,
                         typing_error=None, call_helper=None, metadata=None, reload_init=reload_init,
                         referenced_envs=referenced_envs)
    for env in referenced_envs:
        library.codegen.set_env(env.env_name, env)
    return cres


def module_code(source: str, filename: str, folder: str | None, stem: str) -> types.CodeType:
    """`source` compiled as the module file `filename`: from its entry in `folder` (the file `<stem>.module.<key
    hash>.jgc`, beside the kernel's other files) when a process stored it, else compiled and stored there."""
    if folder is None:
        return compile(source, filename, "exec")
    key = repr((cache.version_tag(), importlib.util.MAGIC_NUMBER.hex(), filename,
                hashlib.sha256(source.encode()).hexdigest()))
    path = os.path.join(folder, f"{stem}.module.{hashlib.sha256(key.encode()).hexdigest()[:20]}.jgc")
    try:
        stored = cache.read_entry(path, key)
    except cache.EntryRejected:
        stored = None
    if stored is not None:
        try:
            code = marshal.loads(stored)
            if isinstance(code, types.CodeType):
                return code
        except (EOFError, ValueError, TypeError):
            pass
        cache.discard(path)
    code = compile(source, filename, "exec")
    cache.write_entry(path, key, marshal.dumps(code))
    return code
