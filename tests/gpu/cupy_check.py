#!/usr/bin/env python3
"""cupy_check.py: CuPy host<->device round trips of large NumPy arrays, verified.

Prints SKIP (exit 0) if cupy or a GPU is missing.  Checks:
  asarray_get   cupy.asarray(numpy array) / .get() of 1 KiB .. 256 MiB arrays, repeated with new
                content, a kernel in between; odd sizes; non-contiguous sources
  set_get_out   ndarray.set() into an existing device array and .get(out=...) into pageable and
                pinned (cupyx.empty_pinned) arrays
  streams       the same on a non-blocking cupy stream, synchronized before checking
"""
import sys


def skip(why):
    print(f"SKIP cupy_check: {why}")
    sys.exit(0)


try:
    import numpy as np
    import cupy as cp
except Exception as e:  # noqa: BLE001 - any import problem means: no cupy here
    skip(f"cupy does not import ({type(e).__name__}: {e})")

try:
    if cp.cuda.runtime.getDeviceCount() == 0:
        skip("no CUDA device")
except Exception as e:  # noqa: BLE001
    skip(f"no usable CUDA device ({e})")

MiB = 1 << 20
SIZES = [1024, 1 * MiB + 3, 16 * MiB, 64 * MiB + 5, 256 * MiB]


def fail(msg):
    print(f"FAIL cupy_check: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def pattern(nbytes, seed):
    n = nbytes // 4
    return ((np.arange(n, dtype=np.int64) * 7 + seed * 1000003) % 1000003).astype(np.int32)


def asarray_get():
    for rep in range(3):
        for nb in SIZES:
            a = pattern(nb, rep)
            g = cp.asarray(a)
            h = (g * 3 + 1).get()
            if not np.array_equal(h, a * 3 + 1):
                fail(f"asarray/get rep {rep} {nb} bytes")
    # odd byte sizes
    for nb in [1, 3, 4097, 1 * MiB + 1]:
        a = np.frombuffer(np.random.default_rng(nb).bytes(nb), dtype=np.uint8)
        if not np.array_equal(cp.asarray(a).get(), a):
            fail(f"uint8 round trip of {nb} bytes")
    # non-contiguous source
    a = pattern(64 * MiB, 9).reshape(-1, 1024)[:, ::3]
    if not np.array_equal(cp.asarray(a).get(), a):
        fail("non-contiguous source")
    print("PASS cupy_check.asarray_get", flush=True)


def set_get_out():
    import cupyx
    for nb in SIZES:
        a = pattern(nb, 40)
        g = cp.empty(a.shape, dtype=a.dtype)
        out_pageable = np.empty_like(a)
        out_pinned = cupyx.empty_pinned(a.shape, dtype=a.dtype)
        for rep in range(3):
            a += 1
            g.set(a)
            g += 2
            g.get(out=out_pageable)
            if not np.array_equal(out_pageable, a + 2):
                fail(f"set/get(out=pageable) {nb} bytes rep {rep}")
            g.get(out=out_pinned)
            cp.cuda.Device().synchronize()
            if not np.array_equal(out_pinned, a + 2):
                fail(f"get(out=pinned) {nb} bytes rep {rep}")
    print("PASS cupy_check.set_get_out", flush=True)


def streams():
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        for rep in range(2):
            for nb in SIZES:
                a = pattern(nb, 70 + rep)
                g = cp.asarray(a)
                h = cp.asnumpy(g * 5, stream=s)
                s.synchronize()
                if not np.array_equal(h, a * 5):
                    fail(f"stream round trip {nb} bytes rep {rep}")
    print("PASS cupy_check.streams", flush=True)


asarray_get()
set_get_out()
streams()
