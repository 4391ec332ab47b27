"""Load a script of the repository (an example, a benchmark) as a module, for tests that call its functions."""
from __future__ import annotations

import importlib.util
import pathlib
import sys
import types

ROOT = pathlib.Path(__file__).resolve().parent.parent


def load_script(relative_path: str, module_name: str) -> types.ModuleType:
    """Import ROOT/relative_path as module_name, registered in sys.modules (its dataclasses look it up there)."""
    spec = importlib.util.spec_from_file_location(module_name, ROOT / relative_path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
