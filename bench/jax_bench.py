#!/usr/bin/env python3
"""JAX transfers of a NumPy array: jax.device_put and np.asarray of a device array.

  jax_bench.py [--size 512M] [--reps 10] [--quick]

  device_put  jax.device_put(numpy_array, gpu).block_until_ready() of a pageable float32 array
  asarray     np.asarray(jax_array) of a device array made just before on the device (a fresh
              one each time: JAX keeps the host copy of an array it has copied once), into the
              fresh NumPy array np.asarray returns
Median GB/s over --reps timings of each, after two untimed ones; the values are checked.
JAX's copies go through its own pinned staging buffers: what the shim can do for them is make
the CPU copy into and out of those buffers faster.  The GPU memory is not preallocated
(XLA_PYTHON_CLIENT_PREALLOCATE=false, set here before JAX is imported), so that JAX takes only
what it uses.

Prints "RESULT bench=jax op=... gbps=..." lines.  Exits 77 (skipped) if numpy or jax does not
import or JAX has no GPU; 1 if a check fails.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import pybench as pb  # noqa: E402

WHO = "jax_bench"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default=None)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n = pb.parse_size(args.size or ("32M" if args.quick else "512M"))
    reps = args.reps or (2 if args.quick else 10)

    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    np = pb.need(WHO, "numpy")
    jax = pb.need(WHO, "jax")
    try:
        gpu = jax.devices("gpu")[0]
    except Exception as e:
        pb.skip(WHO, f"JAX has no GPU backend ({e.__class__.__name__}: {e})")

    elems = n // 4
    host = np.full(elems, 3.0, dtype=np.float32)
    # A new device array per timing, made on the device: its values depend on k.
    bump = jax.jit(lambda a, k: a + k)
    rc = 0

    def put():
        return jax.device_put(host, gpu).block_until_ready()

    for _ in range(2):
        put()
    times = []
    for _ in range(reps):
        t0 = pb.now()
        x = put()
        times.append(pb.now() - t0)
        del x
    x = put()
    if float(x[elems - 1]) != 3.0 or float(x[0]) != 3.0:
        print(f"{WHO}: MISMATCH after device_put", file=sys.stderr)
        rc = 1
    f = pb.gbps_fields(n, times)
    pb.say(f"{WHO}: device_put {n >> 20} MiB: {f['gbps']:.2f} GB/s")
    pb.result("jax", op="device_put", bytes=n, ok=rc == 0, **f)

    times = []
    for r in range(reps + 2):
        k = np.float32(r + 1)
        y = bump(x, k).block_until_ready()
        t0 = pb.now()
        h = np.asarray(y)
        dt = pb.now() - t0
        if r >= 2:
            times.append(dt)
        if h.shape != (elems,) or h[0] != 3.0 + k or h[elems // 2] != 3.0 + k or h[-1] != 3.0 + k:
            print(f"{WHO}: MISMATCH after np.asarray (timing {r})", file=sys.stderr)
            rc = 1
        del y, h
    f = pb.gbps_fields(n, times)
    pb.say(f"{WHO}: np.asarray {n >> 20} MiB: {f['gbps']:.2f} GB/s")
    pb.result("jax", op="asarray", bytes=n, ok=rc == 0, **f)
    return rc


if __name__ == "__main__":
    sys.exit(main())
