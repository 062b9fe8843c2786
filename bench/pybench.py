"""pybench: what the Python benchmarks share (bench/*_bench.py import it from their own folder).

Every benchmark prints "RESULT bench=NAME key=value ..." lines on stdout for bench/summarize.py,
and readable lines on stderr.  A module that does not import, or a GPU that is not there, is a
skip: one "SKIP ..." line and exit status 77, which bench/run_bench.sh records as skipped.
"""
import importlib
import statistics
import sys
import time

SKIP = 77


def parse_size(text):
    """'4096', '64K', '256M', '1.5G' (powers of 1024) -> bytes."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().rstrip("B").rstrip("I")
    num = t.rstrip("KMG")
    return int(float(num) * units[t[len(num):]])


def skip(who, why):
    print(f"SKIP {who}: {why}")
    sys.stdout.flush()
    sys.exit(SKIP)


def need(who, module):
    """Imports module, or skips the benchmark (ImportError or any error of a broken install)."""
    try:
        return importlib.import_module(module)
    except Exception as e:
        skip(who, f"{module} does not import ({e.__class__.__name__}: {e})")


def need_torch_cuda(who, device="cuda"):
    """torch, and a CUDA device unless device is 'cpu' (a dry run of the script's logic)."""
    torch = need(who, "torch")
    if device != "cpu" and not torch.cuda.is_available():
        skip(who, "torch sees no CUDA device")
    return torch


def torch_sync(torch, device):
    if device != "cpu":
        torch.cuda.synchronize()


def result(bench, **fields):
    """One RESULT line; floats with 4 decimals (6 for seconds)."""
    parts = [f"bench={bench}"]
    for k, v in fields.items():
        if isinstance(v, bool):
            v = int(v)
        if isinstance(v, float):
            v = f"{v:.6f}" if k.startswith("seconds") else f"{v:.4f}"
        parts.append(f"{k}={v}")
    print("RESULT " + " ".join(parts))
    sys.stdout.flush()


def gbps_fields(nbytes, secs):
    """gbps (of the median time), gbps_min, gbps_max and seconds_median of timings secs."""
    med = statistics.median(secs)
    return {"seconds_median": med, "gbps": nbytes / med / 1e9,
            "gbps_min": nbytes / max(secs) / 1e9, "gbps_max": nbytes / min(secs) / 1e9,
            "reps": len(secs)}


def say(text):
    print(text, file=sys.stderr)
    sys.stderr.flush()


def now():
    return time.perf_counter()
