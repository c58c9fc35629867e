"""Simulations spread over worker processes, for the benchmark commands' ``--jobs``.

One helper, ``spawned_map``: the simulator is deterministic and CPU-bound, so ``--jobs N``
runs up to N scenarios at once, each in a spawned process (nothing of the parent's state is
shared), and yields the results in the order given, as ``map`` would. On an error or Ctrl-C
the items not started are dropped and the running ones finish before it propagates.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

__all__ = ["spawned_map"]

_In = TypeVar("_In")
_Out = TypeVar("_Out")


def spawned_map(fn: Callable[[_In], _Out], items: Sequence[_In], jobs: int) -> Iterator[_Out]:
    """``map(fn, items)``, in up to ``jobs`` spawned processes (in this one for a single job or
    item). ``fn`` and the items must pickle; so must what ``fn`` returns or raises."""
    if jobs <= 1 or len(items) <= 1:
        yield from map(fn, items)
        return
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(items)), mp_context=context)
    try:
        yield from pool.map(fn, items)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
