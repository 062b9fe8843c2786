#!/usr/bin/env python3
"""CuPy transfer benchmark (run plain and under the shim by bench/run_bench.sh).

  cupy_bench.py [--size 512M] [--reps 10]
      cupy.asarray(numpy_array) of a pageable NumPy array (H2D), and .get() and cupy.asnumpy()
      of a CuPy array, each into a fresh NumPy array each time (D2H); median GB/s of each.
      CuPy copies a NumPy array to the GPU through its own pinned staging buffer.

Prints "RESULT bench=cupy op=... gbps=..." lines.  Exits 77 (skipped) if cupy does not import or
finds no GPU; 1 if a check fails.
"""
import argparse
import statistics
import sys
import time

SKIP = 77


def parse_size(text):
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().rstrip("B").rstrip("I")
    num = t.rstrip("KMG")
    return int(num) * units[t[len(num):]]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="512M")
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    try:
        import numpy as np
        import cupy
    except Exception as e:
        print(f"SKIP cupy_bench: cupy does not import ({e.__class__.__name__}: {e})")
        return SKIP
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no device")
    except Exception as e:
        print(f"SKIP cupy_bench: no CUDA device ({e})")
        return SKIP

    n = parse_size(args.size)
    elems = n // 4
    host = np.full(elems, 3.0, dtype=np.float32)
    dev = cupy.full(elems, 5.0, dtype=cupy.float32)
    sync = cupy.cuda.Device().synchronize

    def timed(fn):
        out = []
        for _ in range(args.reps):
            sync()
            t0 = time.perf_counter()
            r = fn()
            sync()
            out.append(time.perf_counter() - t0)
            del r
        return out

    def report(op, secs):
        med = statistics.median(secs)
        gbps = n / med / 1e9
        print(f"cupy {op} {n >> 20} MiB: {gbps:.2f} GB/s", file=sys.stderr)
        print(f"RESULT bench=cupy op={op} bytes={n} reps={len(secs)} seconds_median={med:.6f} "
              f"gbps={gbps:.4f} gbps_min={n / max(secs) / 1e9:.4f} gbps_max={n / min(secs) / 1e9:.4f}")

    for _ in range(2):  # warm-up (under the shim: promotion)
        cupy.asarray(host)
        dev.get()
    report("asarray", timed(lambda: cupy.asarray(host)))
    report("get", timed(lambda: dev.get()))
    report("asnumpy", timed(lambda: cupy.asnumpy(dev)))
    a = cupy.asarray(host)
    b = dev.get()
    c = cupy.asnumpy(dev)
    if float(a[elems - 1]) != 3.0 or float(b[elems // 2]) != 5.0 or float(c[elems - 1]) != 5.0:
        print("cupy_bench: MISMATCH", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
