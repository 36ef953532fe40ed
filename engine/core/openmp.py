"""One OpenMP thread pool per process, owned by the thread that computes.

With GNU OpenMP (torch's Linux wheels) every thread that runs a parallel region gets its own pool of worker
threads, kept until that thread exits. While the pools together hold more threads than there are CPUs,
libgomp throttles the spin-wait of *every* pool from ~300000 spins to 100, so between two parallel regions
the workers sleep on a futex and each region pays a wake-up (about 240 per decode step here: every linear
is one region). Loading a model makes a pool in the loading thread; an EngineThread makes a second one.
The thread that hands the engine over gives its pool back with release_thread_pool()."""

from __future__ import annotations

import ctypes
import functools
import logging
import sys

import torch  # loads torch's libgomp, the one to find

log = logging.getLogger(__name__)

OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: free the threads, keep nothing


@functools.cache
def _libgomp() -> ctypes.CDLL | None:
    """The libgomp torch runs on (already loaded into this process), or None (other OpenMP runtimes, other
    systems: nothing to do)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = sorted({line.split()[-1] for line in maps if "libgomp" in line and "/" in line})
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
            lib.omp_pause_resource.argtypes = [ctypes.c_int, ctypes.c_int]
            lib.omp_get_initial_device.argtypes = []
            lib.omp_get_max_threads.argtypes = []
            return lib
        except (OSError, AttributeError):  # no OpenMP 5.0 pause API in this libgomp
            continue
    return None


def release_thread_pool() -> bool:
    """Free the OpenMP worker threads the calling thread owns (omp_pause_resource, soft). Harmless when it
    has none; a later parallel region in this thread builds a new pool. False where this does nothing."""
    lib = _libgomp()
    if lib is None:
        return False
    ok = lib.omp_pause_resource(OMP_PAUSE_SOFT, lib.omp_get_initial_device()) == 0
    if not ok:
        log.debug("omp_pause_resource refused (called inside a parallel region?)")
    return ok


def limit_this_thread(count: int) -> bool:
    """Run this thread's parallel regions (torch's and the studio's C++ ops') on `count` threads, leaving every other
    thread's count and torch's default for threads yet to start alone (torch.set_num_threads writes that default
    too). False where this does nothing (no libgomp here)."""
    lib = _libgomp()
    if lib is None:
        return False
    torch.get_num_threads()  # torch's own setup of this thread first: it would set the count back to its default
    lib.omp_set_num_threads(count)
    return True


def thread_max_threads() -> int | None:
    """This thread's own OpenMP thread count (omp_get_max_threads: an ICV per thread, which oneDNN reads
    directly), or None without libgomp."""
    lib = _libgomp()
    return None if lib is None else lib.omp_get_max_threads()
