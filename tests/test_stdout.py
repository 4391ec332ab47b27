"""Compiles in jitgrad's threads never rebind the user's `sys.stdout`: numba's error formatting (run many times
in a compile that succeeds) used to assign back whatever stream it saw on entry, undoing a redirect_stdout or
pytest's capsys that the main thread entered meanwhile."""
import contextlib
import io
import sys
import threading

import numpy as np

import jitgrad as jg
from numba.core import errors as numba_errors


def test_numbas_message_markup_leaves_a_rebound_stdout_in_place() -> None:
    before, replacement = sys.stdout, io.StringIO()
    try:
        with numba_errors.ColorShell():  # entered around every message numba formats
            sys.stdout = replacement  # what the main thread's redirect_stdout does meanwhile
        assert sys.stdout is replacement
    finally:
        sys.stdout = before
    assert "no such op" in numba_errors.termcolor().errmsg("no such op")


def test_prints_after_a_compile_in_another_thread_reach_the_current_redirect() -> None:
    first, second = io.StringIO(), io.StringIO()

    @jg.trace
    def f(x):
        return np.tanh(x) * 3.0 + np.sin(x) ** 2

    with contextlib.redirect_stdout(first):
        worker = threading.Thread(target=lambda: f(np.linspace(0.0, 1.0, 37)))
        worker.start()
        with contextlib.redirect_stdout(second):
            worker.join()
            print("after the compile")
        print("back in the outer redirect")
    assert second.getvalue() == "after the compile\n" and first.getvalue() == "back in the outer redirect\n"
