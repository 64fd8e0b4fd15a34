"""Run independent legs of one test module at the same time (each in a thread of its own), so a
module whose legs mostly wait (a real-time load, a subprocess stepping) costs its longest leg,
not their sum. Each leg's outcome is kept, and re-raised by the test of that leg."""

from __future__ import annotations

import ast
import threading
from typing import Any, Callable, Dict, Hashable, TypeVar

K = TypeVar("K", bound=Hashable)
_COMPILE = threading.Lock()


def literal_eval(text: str) -> Any:
    """ast.literal_eval for legs that run side by side: CPython 3.11 keeps the AST constructor's
    recursion depth in state the threads share, and two of them parsing at once failed with
    "SystemError: AST constructor recursion depth mismatch (before=21, after=18)"."""
    with _COMPILE:
        return ast.literal_eval(text)


class Outcome:
    def __init__(self) -> None:
        self.value: Any = None
        self.error: BaseException | None = None

    def get(self) -> Any:
        """The leg's result, or its exception raised here (in the test that reports it)."""
        if self.error is not None:
            raise self.error
        return self.value


def side_by_side(legs: Dict[K, Callable[[], Any]]) -> Dict[K, Outcome]:
    out = {k: Outcome() for k in legs}

    def run(k: K) -> None:
        try:
            out[k].value = legs[k]()
        except BaseException as e:     # noqa: BLE001 - kept for the leg's own test
            out[k].error = e

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in legs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out
