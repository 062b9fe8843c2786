#!/usr/bin/env python3
"""summarize.py RESULTS_DIR: turn a run of bench/run_bench.sh into summary.md, results.csv,
results.json and the bandwidth-sweep plots.

Reads RESULTS_DIR/env.txt, RESULTS_DIR/raw/manifest.tsv (one line per run), the RESULT lines of
each run's stdout and the shim's stats JSON of each shim run.  Every figure in summary.md is
computed from those files; the only constants here are the targets below.
"""
import csv
import importlib.machinery
import importlib.util
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.realpath(__file__))

# Targets (from the project's issues).  Ratios are "with shim" over the reference named.
TARGETS = {
    "sweep_vs_pinned": 0.90,      # pageable + shim / cudaMallocHost ceiling, every size >= 1 MiB
    "sweep_from_bytes": 1 << 20,
    "loop_vs_pinned": 0.90,       # 256 MiB H2D+D2H x50: pageable + shim / cudaMallocHost
    "alloc_loop_speedup": 3.0,    # alloc-copy-free loop: steps/s with shim / without
    "two_thread_gbps": 90.0,      # two threads, opposite directions, aggregate GB/s with shim
    "staging_gbps": 45.0,         # 256 MiB pageable each way through staging, GB/s
    "latency_ratio_max": 1.03,    # small sync copies: latency with shim / without
    "torch_vs_pin_memory": 1.0,   # DataLoader without pin_memory under shim / pin_memory=True
    "dataloader_vs_pin_memory": 1.0,  # the same with 4 workers (median of the pair ratios)
    "model_up_gbps": 35.0,        # GPT-2-medium-sized model.to("cuda"), GB/s with shim
    "model_down_gbps": 30.0,      # its state_dict() copied to the CPU, GB/s with shim
    "safetensors_speedup": 2.0,   # safetensors load onto the GPU: with shim / without
    "safetensors_gbps": 25.0,     # ... and GB/s with shim
    "fresh_vs_pinned": 0.90,      # fresh malloc buffer, 100 sync copies: shim / cudaMallocHost
    "two_fresh_gbps": 95.0,       # two threads, new 256 MiB malloc buffers per copy, aggregate
    "jax_put_gbps": 20.0,         # jax.device_put of 512 MiB, GB/s with shim
    "jax_get_gbps": 10.0,         # np.asarray(jax_array) of 512 MiB, GB/s with shim
    "cupy_asarray_gbps": 20.0,    # cupy.asarray of 512 MiB, GB/s with shim
    "bounce_pinned_gbps": 30.0,   # CPU memcpy of 512 MiB into cudaMallocHost memory
    "bounce_fresh_gbps": 15.0,    # ... from pinned memory into a destination allocated afresh
    "memcpy_added_ns": 1.0,       # one 64-byte memcpy/memmove: ns added by the shim
    "heap_time_ratio": 1.2,       # malloc+touch+free loops: ns with shim / glibc, every cell
    "heap_fault_ratio": 2.0,      # ... page faults with shim / glibc (or +1 per pair below 1)
    "heap_maps_added": 300,       # 140,000 live 64-72 KiB blocks: mappings beyond glibc's
}


def load_merge():
    path = os.path.join(HERE, "..", "scripts", "pinshim-merge")
    if not os.path.isfile(path):
        return None
    sys.dont_write_bytecode = True  # no __pycache__ next to the scripts
    loader = importlib.machinery.SourceFileLoader("pinshim_merge", path)
    spec = importlib.util.spec_from_loader("pinshim_merge", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def num(v):
    try:
        return int(v)
    except ValueError:
        try:
            return float(v)
        except ValueError:
            return v


def parse_result_lines(path):
    out = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.startswith("RESULT "):
                    continue
                rec = {}
                for tok in line.split()[1:]:
                    if "=" in tok:
                        k, v = tok.split("=", 1)
                        rec[k] = num(v)
                out.append(rec)
    except OSError:
        pass
    return out


def fmt_size(n):
    n = int(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or n % 1024:
            return f"{n} {unit}"
        n //= 1024
    return f"{n} TiB"


def f2(x, suffix=""):
    return "-" if x is None else f"{x:.2f}{suffix}"


def quartile(values):
    """The lower quartile (25th percentile, interpolated) of values, or None."""
    if not values:
        return None
    v = sorted(values)
    pos = (len(v) - 1) * 0.25
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def median_interval(values):
    """Distribution-free ~95% interval of the median: order statistics k and n+1-k (1-based) with
    k from the normal approximation of the binomial; None below 6 values."""
    n = len(values)
    if n < 6:
        return None
    v = sorted(values)
    k = max(1, int((n - 1.96 * math.sqrt(n)) / 2))
    return v[k - 1], v[n - k]


def ratio(a, b):
    return None if a is None or b in (None, 0) else a / b


class Data:
    def __init__(self, outdir):
        self.dir = outdir
        self.raw = os.path.join(outdir, "raw")
        self.env = {}
        try:
            with open(os.path.join(outdir, "env.txt"), encoding="utf-8") as f:
                for line in f:
                    if "=" in line:
                        k, v = line.rstrip("\n").split("=", 1)
                        self.env[k] = v
        except OSError:
            pass
        self.runs = []
        try:
            with open(os.path.join(self.raw, "manifest.tsv"), encoding="utf-8") as f:
                for row in csv.DictReader(f, delimiter="\t"):
                    row["rc"] = int(row["rc"])
                    row["seconds"] = float(row["seconds"])
                    self.runs.append(row)
        except OSError:
            pass
        self.records = []
        self.stats = {}  # (case, side, rep) -> stats dict
        for r in self.runs:
            if r["rc"] == 0:
                for rec in parse_result_lines(os.path.join(self.raw, r["stdout"])):
                    rec.update({"case": r["case"], "side": r["side"], "rep": int(r["rep"])})
                    self.records.append(rec)
            if r.get("stats"):
                try:
                    with open(os.path.join(self.raw, r["stats"]), encoding="utf-8") as f:
                        self.stats[(r["case"], r["side"], r["rep"])] = json.load(f)
                except (OSError, ValueError):
                    pass

    def values(self, case, side, metric, **match):
        return [r[metric] for r in self.records
                if r["case"] == case and r["side"] == side and metric in r
                and isinstance(r[metric], (int, float))
                and all(r.get(k) == v for k, v in match.items())]

    def by_run(self, case, metric, **match):
        """{(side, rep): value} of the records that match."""
        return {(r["side"], r["rep"]): r[metric] for r in self.records
                if r["case"] == case and metric in r and isinstance(r[metric], (int, float))
                and all(r.get(k) == v for k, v in match.items())}

    def pair_ratios(self, case, metric, **match):
        """shim / plain of the same repetition, for every pair where both ran."""
        v = self.by_run(case, metric, **match)
        return [v[("shim", rep)] / v[("plain", rep)] for side, rep in v
                if side == "plain" and ("shim", rep) in v and v[("plain", rep)] > 0]

    def same_side_neighbours(self, case, metric, **match):
        """later / earlier for runs of one side that ran one right after the other (an A/A
        comparison: what the pair ratios look like when nothing differs)."""
        v = self.by_run(case, metric, **match)
        seq = [(run["side"], v[(run["side"], int(run["rep"]))]) for run in self.runs   # run order
               if run["case"] == case and (run["side"], int(run["rep"])) in v]
        return [b / a for (sa, a), (sb, b) in zip(seq, seq[1:]) if sa == sb and a > 0]

    def med(self, case, side, metric, **match):
        v = self.values(case, side, metric, **match)
        return statistics.median(v) if v else None

    def first(self, case, key, default=None):
        """The first value of key among the case's records (sizes the runner chose)."""
        for r in self.records:
            if r["case"] == case and key in r:
                return r[key]
        return default

    def size_of(self, case, key="bytes", default="?"):
        v = self.first(case, key)
        return fmt_size(v) if isinstance(v, int) else default

    def case_runs(self, case):
        return [r for r in self.runs if r["case"] == case]

    def why_missing(self, case, side=None):
        """A short reason why a case has no result."""
        rs = [r for r in self.case_runs(case) if side is None or r["side"] == side]
        if not rs:
            return "not run"
        if all(r["rc"] == 77 for r in rs):
            try:
                with open(os.path.join(self.raw, rs[0]["stdout"]), encoding="utf-8") as f:
                    for line in f:
                        if line.startswith("SKIP"):
                            return "skipped: " + line.split(":", 1)[-1].strip()
            except OSError:
                pass
            return "skipped"
        bad = [r for r in rs if r["rc"] != 0]
        if bad:
            return f"{len(bad)} of {len(rs)} runs failed (exit {bad[0]['rc']})"
        return "no RESULT lines"


class Checks:
    def __init__(self):
        self.rows = []

    def add(self, what, measured, target, ok, note=""):
        if ok is None:
            verdict = "not measured"
        elif ok == "info":
            verdict = "info"
        else:
            verdict = "PASS" if ok else "FAIL"
        self.rows.append([what, measured, target, verdict, note])


def sweep_section(d, checks, md):
    md.append("## Bandwidth sweep: cudaMemcpy, GB/s (median)")
    md.append("")
    sizes = sorted({r["bytes"] for r in d.records if r["case"] == "sweep" and r.get("bench") == "bandwidth"})
    if not sizes:
        md.append(f"Not measured ({d.why_missing('sweep')}).")
        md.append("")
        checks.add("Sweep: pageable + shim vs pinned, sizes >= 1 MiB", "-",
                   f">= {TARGETS['sweep_vs_pinned']:.0%} of pinned", None, d.why_missing("sweep"))
        return {}
    series = {}
    hdr = ["size"]
    for dr in ("h2d", "d2h"):
        D = dr.upper()
        hdr += [f"{D} pageable", f"{D} pageable + shim", f"{D} pinned", f"{D} shim/pinned"]
    rows = []
    for n in sizes:
        row = [fmt_size(n)]
        for dr in ("h2d", "d2h"):
            a = d.med("sweep", "plain", "gbps", bench="bandwidth", kind="pageable", dir=dr, bytes=n)
            b = d.med("sweep", "shim", "gbps", bench="bandwidth", kind="pageable", dir=dr, bytes=n)
            c = d.med("sweep", "plain", "gbps", bench="bandwidth", kind="pinned", dir=dr, bytes=n)
            series.setdefault(dr, []).append((n, a, b, c))
            row += [f2(a), f2(b), f2(c), f2(ratio(b, c))]
        rows.append(row)
    md.append(table(hdr, rows))
    md.append("")
    for dr in ("h2d", "d2h"):
        big = [(n, ratio(b, c)) for n, a, b, c in series[dr] if n >= TARGETS["sweep_from_bytes"]]
        big = [(n, x) for n, x in big if x is not None]
        label = f"Sweep {dr.upper()}: pageable + shim vs pinned, every size >= 1 MiB"
        if not big:
            checks.add(label, "-", f">= {TARGETS['sweep_vs_pinned']:.0%}", None, "no data")
            continue
        worst = min(big, key=lambda t: t[1])
        checks.add(label, f"min {worst[1]:.1%} (at {fmt_size(worst[0])}), median "
                          f"{statistics.median(x for _, x in big):.1%}",
                   f">= {TARGETS['sweep_vs_pinned']:.0%}", worst[1] >= TARGETS["sweep_vs_pinned"])
    return series


def table(headers, rows):
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def plot_sweep(series, outdir):
    """sweep_h2d.png / sweep_d2h.png; returns (files, message)."""
    if not series:
        return [], None
    files = []
    labels = [("pageable, no shim", 1), ("pageable, with pinshim", 2), ("pinned (cudaMallocHost)", 3)]
    if shutil.which("gnuplot"):
        with tempfile.TemporaryDirectory(prefix="pinshim-plot.") as tmp:
            for dr, pts in series.items():
                dat = os.path.join(tmp, dr + ".dat")
                with open(dat, "w") as f:
                    for p in pts:
                        f.write(" ".join(str(p[0]) if i == 0 else ("NaN" if p[i] is None else str(p[i]))
                                         for i in range(4)) + "\n")
                png = os.path.join(outdir, f"sweep_{dr}.png")
                plots = ", ".join(f'"{dat}" using 1:{col + 1} with linespoints title "{t}"'
                                  for t, col in labels)
                script = (f'set terminal pngcairo size 900,550 noenhanced\nset output "{png}"\n'
                          f'set title "cudaMemcpy {dr.upper()} bandwidth"\nset logscale x 2\n'
                          'set format x "%.0b%B"\nset xlabel "copy size (bytes)"\nset ylabel "GB/s"\n'
                          'set yrange [0:*]\nset key left top\nset grid\n'
                          'set datafile missing "NaN"\n'
                          f"plot {plots}\n")
                r = subprocess.run(["gnuplot"], input=script, capture_output=True, text=True)
                if r.returncode != 0 and "pngcairo" in r.stderr:
                    r = subprocess.run(["gnuplot"], input=script.replace("pngcairo", "png"),
                                       capture_output=True, text=True)
                if r.returncode == 0:
                    files.append(os.path.basename(png))
                else:
                    return files, "gnuplot failed: " + r.stderr.strip()[:200]
        return files, None
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return [], "plots skipped: neither gnuplot nor matplotlib is available"
    for dr, pts in series.items():
        fig, ax = plt.subplots(figsize=(9, 5.5))
        for t, col in labels:
            xs = [p[0] for p in pts if p[col] is not None]
            ys = [p[col] for p in pts if p[col] is not None]
            ax.plot(xs, ys, marker="o", label=t)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("copy size (bytes)")
        ax.set_ylabel("GB/s")
        ax.set_ylim(bottom=0)
        ax.set_title(f"cudaMemcpy {dr.upper()} bandwidth")
        ax.grid(True)
        ax.legend(loc="upper left")
        png = os.path.join(outdir, f"sweep_{dr}.png")
        fig.savefig(png, dpi=100)
        plt.close(fig)
        files.append(os.path.basename(png))
    return files, None


def shim_effect_rows(d, merge):
    rows = []
    cases = []
    for r in d.runs:
        if r["side"] == "shim" and r["case"] not in cases:
            cases.append(r["case"])
    for case in cases:
        st = [v for (c, s, _), v in sorted(d.stats.items()) if c == case and s == "shim"]
        if not st:
            rows.append([case, "no stats file"] + [""] * 6)
            continue
        s = st[len(st) // 2]
        if merge is None:
            rows.append([case, "pinshim-merge missing"] + [""] * 6)
            continue
        dv = merge.derived(s)
        sh = lambda k: merge.fmt_share(dv["kinds"][k]["bytes_share"])
        p = s.get("promotions", {})
        rows.append([case,
                     f"{merge.fmt_bytes(dv['dirs']['h2d']['bytes'])} / {merge.fmt_bytes(dv['dirs']['d2h']['bytes'])}",
                     sh("promoted"), sh("staged"), sh("pinned"), sh("pageable"),
                     merge.g(s, "rewrites", "sync_to_async"),
                     f"{merge.g(p, 'count')}/{merge.g(p, 'evictions')}/"
                     f"{merge.g(p, 'failures') + merge.g(s, 'staging', 'failures')}"])
    return rows


def trace_events(path):
    """The events of a PINSHIM_TRACE file, one per line of at least the five header fields: its
    duration in microseconds as written (text), its event name, and its key=value fields."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 5:
                yield parts[1], parts[4], dict(kv.split("=", 1) for kv in parts[5:] if "=" in kv)


def trace_rows(raw):
    """Rows of every raw/*.trace (PINSHIM_TRACE runs): per event kind, and per copy direction, path
    and why, the count, bytes and summed duration, so a traced run's time is read by kind."""
    rows = []
    for name in sorted(os.listdir(raw)) if os.path.isdir(raw) else []:
        if not name.endswith(".trace"):
            continue
        groups = {}
        splits = {}   # staged copies: their CPU time, DMA waits and first pieces' latency, in us
        try:
            for dur, ev, fields in trace_events(os.path.join(raw, name)):
                if ev == "copy":
                    key = f"copy {fields.get('dir', '?')} {fields.get('path', '?')} why={fields.get('why', '?')}"
                elif ev in ("memcpy", "memmove"):
                    key = f"{ev} " + ("shared" if fields.get("shared") == "1" else f"why={fields.get('why', '?')}")
                elif ev in ("heap_alloc", "heap_free"):
                    key = ev + (f" reused={fields.get('reused')}" if ev == "heap_alloc" else f" kept={fields.get('kept')}")
                elif ev == "staged":
                    key = f"staged {fields.get('dir', '?')}"
                    split = splits.setdefault(key, [0, 0, 0])
                    for i, k in enumerate(("cpu_us", "dma_wait_us", "first_us")):
                        try:
                            split[i] += int(fields.get(k, 0))
                        except ValueError:
                            pass
                else:
                    key = ev
                g = groups.setdefault(key, [0, 0, 0.0])
                g[0] += 1
                try:
                    g[1] += int(fields.get("bytes", fields.get("mapping", 0)))
                    g[2] += float(dur) / 1e6
                except ValueError:
                    pass
        except OSError:
            continue
        for key in sorted(groups, key=lambda k: -groups[k][2]):
            n, b, sec = groups[key]
            label = key
            if key in splits:
                cpu, wait, first = splits[key]
                label += f" (CPU {cpu / 1e6:.3f} s, DMA waits {wait / 1e6:.3f} s, first pieces {first / 1e6:.3f} s)"
            rows.append([name[:-len(".trace")], label, str(n), f"{b / 2**30:.2f} GiB", f"{sec:.3f}",
                         f"{b / sec / 1e9:.1f}" if sec > 0 and b else "-"])
    return rows


def shim_time_rows(d, merge):
    """Where time went in the middle shim run of each benchmark: the shim's staging (its CPU copies
    and its waits for a buffer), its own registrations, the copies its threads shared, and the
    program's own pinning calls (which no copy figure includes)."""
    rows = []
    for case in dict.fromkeys(r["case"] for r in d.runs if r["side"] == "shim"):
        st = [v for (c, s, _), v in sorted(d.stats.items()) if c == case and s == "shim"]
        if not st or merge is None:
            continue
        s = st[len(st) // 2]
        g = merge.g
        pp = s.get("program_pinning", {})
        rows.append([case,
                     f"{g(s, 'staging', 'seconds'):.3f} ({g(s, 'staging', 'cpu_seconds'):.3f} / "
                     f"{g(s, 'staging', 'wait_seconds'):.3f})",
                     f"{g(s, 'promotions', 'register_seconds'):.3f} / {g(s, 'promotions', 'unregister_seconds'):.3f}",
                     f"{g(s, 'bounce', 'count')}, {merge.fmt_bytes(g(s, 'bounce', 'bytes'))}, "
                     f"{g(s, 'bounce', 'seconds'):.3f}",
                     f"{g(pp, 'host_allocs')} / {g(pp, 'host_alloc_seconds'):.3f}; "
                     f"{g(pp, 'host_frees')} / {g(pp, 'host_free_seconds'):.3f}",
                     f"{g(pp, 'registers')} / {g(pp, 'register_seconds'):.3f}; "
                     f"{g(pp, 'unregisters')} / {g(pp, 'unregister_seconds'):.3f}"])
    return rows


# ---------------------------------------------------------------- CPU: heap and small memcpy
HEAP_TESTS = (("churn", "one live block per thread"),
              ("working_set", "up to 256 live blocks per thread, random replacement"))


def heap_by_key(records):
    """{(test, size, threads): record} of bench=heap churn/working_set records; a cell measured
    in several runs (run_malloc_bench.sh's HEAP_REPS) gets the median of each figure."""
    runs = {}
    for r in records:
        if r.get("bench") == "heap" and r.get("test") in dict(HEAP_TESTS):
            runs.setdefault((r["test"], r["size"], r["threads"]), []).append(r)
    out = {}
    for key, rs in runs.items():
        cell = dict(rs[-1])
        for field in ("ns_per_pair", "faults_per_pair"):
            vals = [float(x[field]) for x in rs if field in x]
            if vals:
                cell[field] = statistics.median(vals)
        cell["ns_order"] = [float(x["ns_per_pair"]) for x in rs if "ns_per_pair" in x]   # as run
        cell["ns_runs"] = sorted(cell["ns_order"])
        cell["runs"] = len(rs)
        out[key] = cell
    return out


def fault_allowance(plain):
    """Faults per pair the shim may take where glibc takes `plain`: twice as many, or one more
    per pair where glibc takes less than one (a ratio of near-zero counts says nothing)."""
    return max(TARGETS["heap_fault_ratio"] * plain, plain + 1.0)


def heap_report(plain_recs, shim_recs, checks):
    """Markdown lines of the heap tables; adds the heap and memcpy targets to checks."""
    out = []
    a, b = heap_by_key(plain_recs), heap_by_key(shim_recs)
    threads = sorted({k[2] for k in a})
    for test, what in HEAP_TESTS:
        sizes = sorted({k[1] for k in a if k[0] == test})
        if not sizes:
            continue
        nruns = min((c.get("runs", 1) for c in list(a.values()) + list(b.values())), default=1)
        out.append(f"malloc + touch every page + free, {what}: ns per pair per thread "
                   "(glibc / with shim = ratio) and page faults per pair (glibc / with shim)"
                   + (f"; each figure the median of {nruns} runs of each side, alternating" if nruns > 1 else ""))
        out.append("")
        hdr = ["size"]
        for t in threads:
            hdr += [f"{t} thread{'s' if t > 1 else ''}: ns", "faults"]
        rows, worst_t, worst_f, bad_f, cells = [], None, None, 0, 0
        worst_pair = None   # (median pair ratio, where, the pairs' ratios)
        for n in sizes:
            row = [fmt_size(n)]
            for t in threads:
                pa, pb = a.get((test, n, t)), b.get((test, n, t))
                if pa is None:
                    row += ["-", "-"]
                    continue
                if pb is None:
                    row += [f"{pa['ns_per_pair']:.0f} / -", f"{pa['faults_per_pair']:.2f} / -"]
                    continue
                x = ratio(pb["ns_per_pair"], pa["ns_per_pair"])
                row += [f"{pa['ns_per_pair']:.0f} / {pb['ns_per_pair']:.0f} = {x:.2f}x",
                        f"{pa['faults_per_pair']:.2f} / {pb['faults_per_pair']:.2f}"]
                cells += 1
                where = f"{fmt_size(n)}, {t} thread{'s' if t > 1 else ''}"
                if worst_t is None or x > worst_t[0]:
                    worst_t = (x, where, pa["ns_runs"], pb["ns_runs"])
                # Run i of each side ran one after the other (run_malloc_bench.sh alternates):
                # their ratio cancels what the machine did over seconds, as pairs do in the
                # latency benchmark.
                if len(pa["ns_order"]) > 1 and len(pa["ns_order"]) == len(pb["ns_order"]):
                    pairs = [ratio(y, x) for x, y in zip(pa["ns_order"], pb["ns_order"])]
                    m = statistics.median(pairs)
                    if worst_pair is None or m > worst_pair[0]:
                        worst_pair = (m, where, pairs)
                over = pb["faults_per_pair"] - fault_allowance(pa["faults_per_pair"])
                bad_f += over > 0 or not pb.get("ok", 1)
                if worst_f is None or over > worst_f[0]:
                    worst_f = (over, where, pa["faults_per_pair"], pb["faults_per_pair"])
            rows.append(row)
        out.append(table(hdr, rows))
        out.append("")
        label = (f"Heap ({test}, {fmt_size(sizes[0])}..{fmt_size(sizes[-1])} x "
                 f"{'/'.join(str(t) for t in threads)} threads): time with shim / glibc, worst cell")
        if worst_t is None:
            checks.add(label, "-", f"<= {TARGETS['heap_time_ratio']:.1f}x", None, "no shim run")
        else:
            # The worst cell's runs, each side: whether its ratio stands out of the runs' own spread
            # (cells at 16 threads on a 16-core machine vary from run to run).
            spread = ""
            if len(worst_t[2]) > 1 or len(worst_t[3]) > 1:
                spread = ("that cell's runs, ns: glibc " + ", ".join(f"{v:.0f}" for v in worst_t[2])
                          + "; with shim " + ", ".join(f"{v:.0f}" for v in worst_t[3]))
            checks.add(label, f"{worst_t[0]:.2f}x ({worst_t[1]})", f"<= {TARGETS['heap_time_ratio']:.1f}x",
                       worst_t[0] <= TARGETS["heap_time_ratio"], spread)
            if worst_pair is not None:
                checks.add(f"Heap ({test}): the same, each shim run against the glibc run just before it, "
                           "median pair ratio, worst cell",
                           f"{worst_pair[0]:.2f}x ({worst_pair[1]}; pairs "
                           + ", ".join(f"{v:.2f}" for v in worst_pair[2]) + ")",
                           f"(reported; the target is judged above)", "info")
            checks.add(f"Heap ({test}): page faults per pair with shim vs glibc",
                       f"{bad_f} of {cells} cells over; worst {worst_f[3]:.2f} vs {worst_f[2]:.2f} "
                       f"({worst_f[1]})",
                       f"<= {TARGETS['heap_fault_ratio']:.0f}x glibc's (+1 where glibc's < 1)", bad_f == 0)
    ma = [r for r in plain_recs if r.get("bench") == "heap" and r.get("test") == "many_blocks"]
    mb = [r for r in shim_recs if r.get("bench") == "heap" and r.get("test") == "many_blocks"]
    if ma:
        rows = []
        for side, rs in (("glibc", ma), ("with shim", mb)):
            for r in rs[:1]:
                rows.append([side, f"{r['made']} of {r['blocks']}", r["maps_before"], r["maps_peak"],
                             r["maps_after"], f"{r['ns_per_malloc']:.0f}", f"{r['ns_per_free']:.0f}"])
        out.append(f"{ma[0]['blocks']} live blocks of {fmt_size(ma[0]['size_min'])}..{fmt_size(ma[0]['size_max'])} "
                   "(one byte written in each): lines of /proc/self/maps")
        out.append("")
        out.append(table(["", "blocks allocated", "mappings before", "at the peak", "after the frees",
                          "ns per malloc", "ns per free"], rows))
        out.append("")
        label = f"Heap: {ma[0]['blocks']} live 64-72 KiB blocks, mappings at the peak beyond glibc's"
        if mb:
            added = mb[0]["maps_peak"] - ma[0]["maps_peak"]
            ok = added <= TARGETS["heap_maps_added"] and mb[0]["ok"] == 1
            checks.add(label, f"{added:+d} ({mb[0]['maps_peak']} vs {ma[0]['maps_peak']})"
                       + ("" if mb[0]["ok"] == 1 else f"; malloc failed after {mb[0]['made']} blocks"),
                       f"<= +{TARGETS['heap_maps_added']}", ok)
        else:
            checks.add(label, "-", f"<= +{TARGETS['heap_maps_added']}", None, "no shim run")
    ca = {r["test"]: r["ns_median"] for r in plain_recs if r.get("bench") == "memcpy_overhead"}
    cb = {r["test"]: r["ns_median"] for r in shim_recs if r.get("bench") == "memcpy_overhead"}
    added = [(cb[t] - ca[t], t) for t in ca if t in cb]
    if added:
        w = max(added)
        checks.add("One 64-byte memcpy/memmove/memset (via pointer / direct call): ns added by the shim, worst",
                   f"{w[0]:+.2f} ns ({w[1]}; {', '.join(f'{t} {x:+.2f}' for x, t in sorted(added, key=lambda y: y[1]))})",
                   f"<= {TARGETS['memcpy_added_ns']:.0f} ns", w[0] <= TARGETS["memcpy_added_ns"])
    elif ca:
        checks.add("One 64-byte memcpy/memmove/memset: ns added by the shim", "-",
                   f"<= {TARGETS['memcpy_added_ns']:.0f} ns", None, "no shim run")
    return out


def heap_main(plain_path, shim_path):
    """summarize.py --heap PLAIN.txt SHIM.txt: the heap tables and their targets, for
    bench/run_malloc_bench.sh (which `make test` runs too)."""
    checks = Checks()
    lines = heap_report(parse_result_lines(plain_path), parse_result_lines(shim_path), checks)
    print("\n".join(lines))
    if checks.rows:
        print(table(["what", "measured", "target", "result", "note"], checks.rows))
    return 0


def main(argv):
    if len(argv) == 3 and argv[0] == "--heap":
        return heap_main(argv[1], argv[2])
    if len(argv) != 1:
        print("usage: summarize.py RESULTS_DIR | --heap PLAIN.txt SHIM.txt", file=sys.stderr)
        return 2
    outdir = argv[0]
    d = Data(outdir)
    merge = load_merge()
    checks = Checks()
    md = []
    e = d.env
    md.append("# pinshim benchmark results")
    md.append("")
    md.append(f"- Date: {e.get('date', '?')}")
    gpu = e.get("gpu", "?")
    if gpu != "none":
        md.append(f"- GPU: {gpu} (x{e.get('gpus', '?')}), driver {e.get('driver', '?')}, CUDA "
                  f"(driver) {e.get('cuda_driver', '?')}, PCIe gen/width {e.get('pcie', '?')}")
    else:
        md.append("- GPU: none found")
    md.append(f"- Toolkit: nvcc {e.get('nvcc', '?')}; Python {e.get('python', '?')}")
    md.append(f"- Host: {e.get('cpu', '?')}, {e.get('memory', '?')}, {e.get('host', '?')}")
    md.append(f"- pinshim commit {e.get('commit', '?')}; {e.get('reps', '?')} A/B pair(s) per benchmark "
              f"({e.get('sweep_reps', '?')} for the sweep); shim library {e.get('shim', '?')}")
    md.append("- Method: each benchmark runs without the shim and under it (`scripts/pinshim`, "
              "PINSHIM_MODE=full) alternately; figures are medians over the runs (and, inside each "
              "run, over repeated timings).")
    if e.get("quick") == "1":
        md.append("- **QUICK RUN (BENCH_QUICK=1): small sizes, one repetition. Not a measurement.**")
    md.append("")
    body = []

    if gpu == "none":
        body.append("No GPU was found on this machine: only the CPU malloc benchmark ran. The "
                    "transfer benchmarks need a machine with an NVIDIA GPU (`make bench` there).")
        body.append("")

    # ---------------------------------------------------------------- sweep
    series = {}
    if gpu != "none":
        series = sweep_section(d, checks, body)
        files, msg = plot_sweep(series, outdir)
        for f in files:
            body.append(f"![{f}]({f})")
        if msg:
            body.append(f"({msg})")
        body.append("")

    # ---------------------------------------------------------------- loop
    if gpu != "none":
        lsz = d.size_of("loop_pageable", default=d.size_of("loop_pinned"))
        lit = d.first("loop_pageable", "iters", d.first("loop_pinned", "iters", "?"))
        body.append(f"## {lsz} buffer, H2D then D2H, x{lit} (GB/s, whole loop timed, promotion included)")
        body.append("")
        rows = []
        for case, what in (("loop_pageable", "malloc buffer"), ("loop_static", "malloc buffer, static cudart"),
                           ("loop_pinned", "cudaMallocHost buffer")):
            a, b = d.med(case, "plain", "gbps"), d.med(case, "shim", "gbps")
            rows.append([what, f2(a), f2(b), f2(ratio(b, a), "x")])
        body.append(table(["host buffer", "without shim", "with shim", "shim speedup"], rows))
        body.append("")
        shim_pg = d.med("loop_pageable", "shim", "gbps")
        pin = d.med("loop_pinned", "plain", "gbps")
        r = ratio(shim_pg, pin)
        checks.add(f"{lsz} H2D+D2H x{lit}: pageable + shim vs cudaMallocHost",
                   "-" if r is None else f"{r:.1%} ({f2(shim_pg)} vs {f2(pin)} GB/s)",
                   f">= {TARGETS['loop_vs_pinned']:.0%}", None if r is None else r >= TARGETS["loop_vs_pinned"],
                   "" if r is not None else d.why_missing("loop_pageable"))
        st = ratio(d.med("loop_static", "shim", "gbps"), pin)
        if st is not None:
            checks.add("same, static cudart build", f"{st:.1%}", f">= {TARGETS['loop_vs_pinned']:.0%}",
                       st >= TARGETS["loop_vs_pinned"])

    # ---------------------------------------------------------------- latency
    if gpu != "none":
        body.append("## Small-copy latency: one sync cudaMemcpy, microseconds (median)")
        body.append("")
        keys = sorted({(r["bytes"], r["kind"], r["dir"]) for r in d.records
                       if r["case"] == "latency" and r.get("bench") == "latency"})
        rows, worst = [], None
        for n, kind, dr in keys:
            sel = dict(bytes=n, kind=kind, dir=dr)
            a = d.med("latency", "plain", "us_median", **sel)
            b = d.med("latency", "shim", "us_median", **sel)
            pr = d.pair_ratios("latency", "us_median", **sel)
            pm = statistics.median(pr) if pr else None
            ci = median_interval(pr)
            aa = d.same_side_neighbours("latency", "us_median", **sel)
            qa = quartile(d.values("latency", "plain", "us_median", **sel))
            qb = quartile(d.values("latency", "shim", "us_median", **sel))
            x, qx = ratio(b, a), ratio(qb, qa)
            rows.append([fmt_size(n), kind, dr.upper(), f2(a), f2(b),
                         "-" if pm is None else f"{pm:.3f}",
                         "-" if ci is None else f"{ci[0]:.3f}..{ci[1]:.3f}",
                         str(len(pr)),
                         "-" if x is None else f"{x:.3f}", "-" if qx is None else f"{qx:.3f}",
                         f"{statistics.median(aa):.3f} ({len(aa)})" if aa else "-"])
            if pm is not None and (worst is None or pm > worst[0]):
                worst = (pm, f"{fmt_size(n)} {kind} {dr.upper()}", ci)
        if rows:
            body.append(table(["size", "host memory", "dir", "without shim", "with shim",
                               "median pair ratio", "~95% interval", "pairs", "ratio of medians",
                               "ratio of lower quartiles", "A/A: same side, neighbours (n)"], rows))
            body.append("")
            body.append("Each run's figure is the median of its copies. A pair is one run without "
                        "and one with the shim, one right after the other (the order swapped every "
                        "other pair); the target is judged on the median over the pairs of the "
                        "ratio within each pair, with a distribution-free ~95% interval of that "
                        "median. The machine drifts between a fast state and one about 1 us slower "
                        "per copy that lasts seconds and spans several runs of either side, so "
                        "comparing the two sides' medians (\"ratio of medians\") mostly measures how "
                        "many runs of each side fell into the slow state; pairing runs adjacent in "
                        "time cancels most of it. The last column is the same pairing applied to "
                        "neighbouring runs of one side (nothing differs): the noise of the "
                        "pairing itself.")
        else:
            body.append(f"Not measured ({d.why_missing('latency')}).")
        body.append("")
        lat_sizes = sorted({k[0] for k in keys})
        lat_range = f"{fmt_size(lat_sizes[0])}..{fmt_size(lat_sizes[-1])}" if lat_sizes else "small"
        measured = "-"
        if worst is not None:
            measured = f"{worst[0]:.3f} ({worst[1]}"
            measured += f"; interval {worst[2][0]:.3f}..{worst[2][1]:.3f})" if worst[2] else ")"
        checks.add(f"Small copies ({lat_range}): median latency ratio with shim / without "
                   "(pairs adjacent in time), worst case", measured,
                   f"<= {TARGETS['latency_ratio_max']:.2f}",
                   None if worst is None else worst[0] <= TARGETS["latency_ratio_max"],
                   "" if worst else d.why_missing("latency"))

    # ---------------------------------------------------------------- staging
    if gpu != "none":
        ssz = d.size_of("staging")
        body.append(f"## Staging: {ssz} pageable copies the shim may not promote (small budget), GB/s")
        body.append("")
        rows = []
        staged = [merge.g(v, "staging", "bytes") for (c, s, _), v in d.stats.items()
                  if c == "staging" and s == "shim"] if merge else []
        for dr in ("h2d", "d2h"):
            a = d.med("staging", "plain", "gbps", dir=dr)
            b = d.med("staging", "shim", "gbps", dir=dr)
            rows.append([dr.upper(), f2(a), f2(b), f2(ratio(b, a), "x")])
            note = ""
            if staged and not any(staged):
                note = "the shim's stats show no staged bytes: these copies were not staged"
            checks.add(f"Staged {ssz} {dr.upper()}, GB/s with shim", f2(b),
                       f">= {TARGETS['staging_gbps']:.0f} GB/s",
                       None if b is None else b >= TARGETS["staging_gbps"],
                       note if b is not None else d.why_missing("staging"))
        body.append(table(["dir", "without shim (driver's pageable path)", "with shim (staged)", "speedup"], rows))
        if staged and merge:
            body.append("")
            body.append(f"Bytes staged per shim run (from its stats): "
                        f"{', '.join(merge.fmt_bytes(x) for x in staged)}.")
        body.append("")

    # ---------------------------------------------------------------- loops
    if gpu != "none":
        body.append(f"## Training-style loops, steps/s ({d.size_of('train_reuse', 'batch')} batch H2D, "
                    f"kernel, {d.size_of('train_reuse', 'result')} result D2H, "
                    f"{d.first('train_reuse', 'steps', '?')} steps)")
        body.append("")
        rows = []
        pinned_ref = d.med("train_pinned", "plain", "steps_per_s")
        for case, what in (("train_reuse", "CUDA runtime, buffers reused"),
                           ("train_realloc", "CUDA runtime, malloc/free every step (alloc-copy-free)"),
                           ("train_reuse_light", "CUDA runtime, buffers reused, transfer-bound"),
                           ("train_realloc_light", "CUDA runtime, malloc/free every step, transfer-bound"),
                           ("drv_reuse", "driver API, buffers reused"),
                           ("drv_realloc", "driver API, malloc/free every step")):
            a, b = d.med(case, "plain", "steps_per_s"), d.med(case, "shim", "steps_per_s")
            rows.append([what, f2(a), f2(b), f2(ratio(b, a), "x")])
            if case == "train_realloc":
                x = ratio(b, a)
                checks.add("Alloc-copy-free loop: speedup with shim", f2(x, "x"),
                           f">= {TARGETS['alloc_loop_speedup']:.1f}x",
                           None if x is None else x >= TARGETS["alloc_loop_speedup"],
                           "" if x is not None else d.why_missing(case))
            elif case in ("train_reuse_light", "train_realloc_light"):
                x = ratio(b, a)
                checks.add(f"Training loop ({what}): speedup with shim", f2(x, "x"),
                           f">= {TARGETS['alloc_loop_speedup']:.1f}x",
                           None if x is None else x >= TARGETS["alloc_loop_speedup"],
                           "" if x is not None else d.why_missing(case))
            elif case in ("train_reuse", "drv_reuse", "drv_realloc"):
                x = ratio(b, a)
                checks.add(f"Training loop ({what}): speedup with shim", f2(x, "x"), "(reported)",
                           None if x is None else "info", "" if x is not None else d.why_missing(case))
        rows.append(["reference: CUDA runtime, cudaMallocHost buffers", f2(pinned_ref), "-", "-"])
        rows.append(["reference: the same, transfer-bound", f2(d.med("train_pinned_light", "plain", "steps_per_s")), "-", "-"])
        body.append(table(["loop", "without shim", "with shim", "speedup"], rows))
        body.append("")

    # ---------------------------------------------------------------- two threads
    if gpu != "none":
        body.append(f"## {d.first('two_pinned', 'threads', 'Two')} host threads, H2D || D2H, "
                    f"{d.size_of('two_pinned', default=d.size_of('two_pageable'))} each, plain cudaMemcpy "
                    "(aggregate GB/s)")
        body.append("")
        rows = []
        for case, what in (("two_pinned", "cudaMallocHost buffers"), ("two_pageable", "malloc buffers")):
            a, b = d.med(case, "plain", "gbps"), d.med(case, "shim", "gbps")
            rows.append([what, f2(a), f2(b), f2(ratio(b, a), "x")])
            checks.add(f"Two threads, opposite directions ({what}): aggregate GB/s with shim",
                       "-" if b is None else f"{b:.1f} (without: {f2(a)})",
                       f">= {TARGETS['two_thread_gbps']:.0f} GB/s",
                       None if b is None else b >= TARGETS["two_thread_gbps"],
                       "" if b is not None else d.why_missing(case))
        body.append(table(["host buffers", "without shim", "with shim", "ratio"], rows))
        body.append("")

    # ---------------------------------------------------------------- torch
    if gpu != "none":
        body.append("## PyTorch")
        body.append("")
        nopin = d.med("torch_dl_nopin", "plain", "batches_per_s")
        nopin_shim = d.med("torch_dl_nopin", "shim", "batches_per_s")
        pin = d.med("torch_dl_pin", "plain", "batches_per_s")
        if nopin is None and pin is None:
            body.append(f"DataLoader loop not measured ({d.why_missing('torch_dl_nopin')}).")
        else:
            body.append(table(["DataLoader loop (64 x 3x224x224 float, workers=0)", "batches/s"],
                              [["pin_memory=False", f2(nopin)], ["pin_memory=True", f2(pin)],
                               ["pin_memory=False, under pinshim", f2(nopin_shim)]]))
        body.append("")
        x = ratio(nopin_shim, pin)
        checks.add("PyTorch DataLoader: no pin_memory + shim vs pin_memory=True", f2(x, "x"),
                   f">= {TARGETS['torch_vs_pin_memory']:.2f}x",
                   None if x is None else x >= TARGETS["torch_vs_pin_memory"],
                   "" if x is not None else d.why_missing("torch_dl_nopin"))
        rows = []
        for op, what in (("cuda", "tensor.cuda(), pageable tensor"), ("cpu", "cuda_tensor.cpu() (fresh CPU tensor)"),
                         ("cuda_pinned", "tensor.cuda(), pinned tensor (reference)")):
            a = d.med("torch_transfer", "plain", "gbps", op=op)
            b = d.med("torch_transfer", "shim", "gbps", op=op)
            rows.append([what, f2(a), f2(b), f2(ratio(b, a), "x")])
            if op != "cuda_pinned":
                checks.add(f"PyTorch {what}: speedup with shim", f2(ratio(b, a), "x"), "(reported)",
                           None if ratio(b, a) is None else "info",
                           "" if ratio(b, a) is not None else d.why_missing("torch_transfer"))
        if any(r[1] != "-" for r in rows):
            body.append(table([f"{d.size_of('torch_transfer')} transfer, GB/s", "without shim", "with shim",
                               "speedup"], rows))
        else:
            body.append(f"Transfers not measured ({d.why_missing('torch_transfer')}).")
        body.append("")

    # ---------------------------------------------------------------- cupy
    if gpu != "none":
        body.append(f"## CuPy ({d.size_of('cupy')}, GB/s)")
        body.append("")
        rows = []
        for op, what in (("asarray", "cupy.asarray(numpy array)"), ("get", "cupy_array.get()"),
                         ("asnumpy", "cupy.asnumpy(cupy_array), a fresh array each time")):
            a, b = d.med("cupy", "plain", "gbps", op=op), d.med("cupy", "shim", "gbps", op=op)
            if op == "asnumpy" and a is None and b is None:
                continue
            rows.append([what, f2(a), f2(b), f2(ratio(b, a), "x")])
            checks.add(f"CuPy {what}: speedup with shim", f2(ratio(b, a), "x"), "(reported)",
                       None if ratio(b, a) is None else "info",
                       "" if ratio(b, a) is not None else d.why_missing("cupy"))
            if op == "asarray":
                checks.add(f"CuPy {what}: GB/s with shim", "-" if b is None else f"{b:.1f} (without: {f2(a)})",
                           f">= {TARGETS['cupy_asarray_gbps']:.0f} GB/s",
                           None if b is None else b >= TARGETS["cupy_asarray_gbps"],
                           "" if b is not None else d.why_missing("cupy"))
        if any(r[1] != "-" for r in rows):
            body.append(table(["operation", "without shim", "with shim", "speedup"], rows))
        else:
            body.append(f"Not measured ({d.why_missing('cupy')}).")
        body.append("")

    # ---------------------------------------------------------------- cold copies: a model
    def ran(*cases):
        return any(d.case_runs(c) for c in cases)

    def gbps_check(label, value, target, case, extra=""):
        checks.add(label, "-" if value is None else f"{value:.1f}{extra}", f">= {target:.0f} GB/s",
                   None if value is None else value >= target, "" if value is not None else d.why_missing(case))

    if gpu != "none" and ran("model"):
        mb = d.first("model", "bytes")
        body.append(f"## A GPT-2-medium-sized model: model.to(\"cuda\") and state_dict() to the CPU "
                    f"({'-' if mb is None else f'{mb / 1e9:.2f} GB'}, {d.first('model', 'tensors', '?')} tensors; GB/s)")
        body.append("")
        rows = []
        for op, what in (("to_cuda", "model.to(\"cuda\"), the first move"),
                         ("state_dict_cpu", "{k: v.to(\"cpu\") for k, v in state_dict().items()}, median")):
            a, b = d.med("model", "plain", "gbps", op=op), d.med("model", "shim", "gbps", op=op)
            c = d.med("model_pinned", "plain", "gbps", op=op.replace("_cpu", "") + "_pinned")
            x = ratio(b, c)
            rows.append([what, f2(a), f2(b), f2(ratio(b, a), "x"), f2(c), "-" if x is None else f"{x:.1%}"])
        body.append(table(["copy", "without shim", "with shim", "speedup",
                           "from / into pinned memory, without shim", "shim / pinned"], rows))
        body.append("")
        body.append("Each process builds the model on the CPU and moves it once; the checkpoint copies "
                    "are repeated in the process. Figures are medians over the processes. The pinned "
                    "column is the same program with the model's tensors pinned before the move and "
                    "each checkpoint copied into pinned tensors allocated beforehand (one process): the "
                    "most this program's per-tensor copies reach, whatever carries the bytes.")
        body.append("")
        gbps_check("Model (GPT-2 medium) model.to(\"cuda\"): GB/s with shim",
                   d.med("model", "shim", "gbps", op="to_cuda"), TARGETS["model_up_gbps"], "model",
                   f" (without: {f2(d.med('model', 'plain', 'gbps', op='to_cuda'))})")
        gbps_check("Model state_dict() to the CPU (checkpoint): GB/s with shim",
                   d.med("model", "shim", "gbps", op="state_dict_cpu"), TARGETS["model_down_gbps"], "model",
                   f" (without: {f2(d.med('model', 'plain', 'gbps', op='state_dict_cpu'))})")

    # ---------------------------------------------------------------- cold copies: safetensors
    if gpu != "none" and ran("safetensors"):
        sb = d.first("safetensors", "bytes")
        body.append(f"## safetensors checkpoint onto the GPU ({'-' if sb is None else f'{sb / 2**20:.0f} MiB'}, "
                    f"{d.first('safetensors', 'tensors', '?')} tensors of 4 KiB..200 MiB, file in the page cache; GB/s)")
        body.append("")
        rows = []
        for op, what in (("load_cuda", "load_file(path, device=\"cuda\")"),
                         ("load_then_cuda", "load_file(path), then .cuda() per tensor")):
            a, b = d.med("safetensors", "plain", "gbps", op=op), d.med("safetensors", "shim", "gbps", op=op)
            x = ratio(b, a)
            rows.append([what, f2(a), f2(b), f2(x, "x")])
            checks.add(f"safetensors {what}: speedup with shim", f2(x, "x"),
                       f">= {TARGETS['safetensors_speedup']:.1f}x",
                       None if x is None else x >= TARGETS["safetensors_speedup"],
                       "" if x is not None else d.why_missing("safetensors"))
            gbps_check(f"safetensors {what}: GB/s with shim", b, TARGETS["safetensors_gbps"], "safetensors",
                       f" (without: {f2(a)})")
        body.append(table(["load", "without shim", "with shim", "speedup"], rows))
        body.append("")

    # ---------------------------------------------------------------- DataLoader with workers
    if gpu != "none" and ran("dataloader"):
        body.append(f"## DataLoader, {d.first('dataloader', 'workers', 4)} workers (batches in shared memory), "
                    "64 x 3x224x224 float, batches/s")
        body.append("")
        rows = []
        for case, side, what in (("dataloader", "plain", "pin_memory=True, without shim (the reference)"),
                                 ("dataloader", "shim", "pin_memory=False, with shim"),
                                 ("dataloader_nopin", "plain", "pin_memory=False, without shim")):
            v = d.values(case, side, "batches_per_s")
            if v:
                med = statistics.median(v)
                rows.append([what, f2(med), f2(min(v)), f2(max(v)), f"{(max(v) - min(v)) / med:.1%}", len(v)])
            else:
                rows.append([what, "-", "-", "-", "-", 0])
        body.append(table(["loader", "median", "min", "max", "spread (max-min)/median", "runs"], rows))
        body.append("")
        pr = d.pair_ratios("dataloader", "batches_per_s")
        pm = statistics.median(pr) if pr else None
        rom = ratio(d.med("dataloader", "shim", "batches_per_s"), d.med("dataloader", "plain", "batches_per_s"))
        if pr:
            body.append(f"Pairs (one run of each, one right after the other, the order swapped every other "
                        f"pair), with shim / reference: {', '.join(f'{x:.3f}' for x in pr)}; median "
                        f"{pm:.3f}, ratio of the medians {f2(rom)}.")
            body.append("")
        checks.add("DataLoader, 4 workers: pin_memory=False + shim vs pin_memory=True (median pair ratio)",
                   "-" if pm is None else f"{pm:.3f} (pairs {min(pr):.3f}..{max(pr):.3f}, n={len(pr)})",
                   f">= {TARGETS['dataloader_vs_pin_memory']:.2f}x",
                   None if pm is None else pm >= TARGETS["dataloader_vs_pin_memory"],
                   "" if pm is not None else d.why_missing("dataloader"))

    # ---------------------------------------------------------------- fresh buffers
    if gpu != "none" and ran("fresh_pageable", "fresh_pinned"):
        body.append(f"## Fresh buffer, {d.first('fresh_pageable', 'copies', d.first('fresh_pinned', 'copies', '?'))} "
                    f"sync copies, a {d.size_of('fresh_pageable', 'evict_bytes', d.size_of('fresh_pinned', 'evict_bytes'))} "
                    "memset of another buffer before each (GB/s of the copies, the first included)")
        body.append("")
        sizes = sorted({r["bytes"] for r in d.records if r["case"] in ("fresh_pageable", "fresh_pinned")})
        rows = []
        worst = None
        for n in sizes:
            for dr in ("h2d", "d2h"):
                a = d.med("fresh_pageable", "plain", "gbps", bytes=n, dir=dr)
                b = d.med("fresh_pageable", "shim", "gbps", bytes=n, dir=dr)
                c = d.med("fresh_pinned", "plain", "gbps", bytes=n, dir=dr)
                fa = d.med("fresh_pageable", "shim", "first_us", bytes=n, dir=dr)
                x = ratio(b, c)
                rows.append([fmt_size(n), dr.upper(), f2(a), f2(b), f2(c), "-" if x is None else f"{x:.1%}",
                             "-" if fa is None else f"{fa:.0f}"])
                if x is not None and (worst is None or x < worst[0]):
                    worst = (x, f"{fmt_size(n)} {dr.upper()}")
        body.append(table(["size", "dir", "malloc, without shim", "malloc, with shim",
                           "cudaMallocHost, without shim", "shim / pinned", "first copy with shim (us)"], rows))
        body.append("")
        what = (f"{d.first('fresh_pageable', 'copies')} sync copies ({', '.join(fmt_size(n) for n in sizes)}; "
                "H2D, D2H)" if sizes else "sync copies")
        checks.add(f"Fresh malloc buffer, {what}: shim vs cudaMallocHost, worst",
                   "-" if worst is None else f"{worst[0]:.1%} ({worst[1]})",
                   f">= {TARGETS['fresh_vs_pinned']:.0%} at each size",
                   None if worst is None else worst[0] >= TARGETS["fresh_vs_pinned"],
                   "" if worst is not None else d.why_missing("fresh_pageable"))

    if gpu != "none" and ran("two_fresh"):
        body.append(f"## Two threads, H2D || D2H, a new {d.size_of('two_fresh')} malloc buffer per copy "
                    f"(malloc, copy, free; {d.first('two_fresh', 'copies', '?')} copies each; aggregate GB/s)")
        body.append("")
        a, b = d.med("two_fresh", "plain", "gbps"), d.med("two_fresh", "shim", "gbps")
        fa, fb = d.med("two_fresh", "plain", "gbps_first"), d.med("two_fresh", "shim", "gbps_first")
        body.append(table(["", "without shim", "with shim", "ratio"],
                          [["median of the timings", f2(a), f2(b), f2(ratio(b, a), "x")],
                           ["the first timing of a process", f2(fa), f2(fb), f2(ratio(fb, fa), "x")]]))
        body.append("")
        gbps_check(f"Two threads, new {d.size_of('two_fresh', default='')} malloc buffers per copy: "
                   "aggregate GB/s with shim".replace("  ", " "), b,
                   TARGETS["two_fresh_gbps"], "two_fresh", f" (without: {f2(a)})")

    # ---------------------------------------------------------------- bounce copies
    if gpu != "none" and ran("bounce"):
        body.append(f"## CPU memcpy to and from cudaMallocHost memory ({d.size_of('bounce')}; GB/s): what a "
                    "framework's own pinned staging costs")
        body.append("")
        rows = []
        for op, what, target in (("to_pinned", "malloc (resident) -> pinned", "bounce_pinned_gbps"),
                                 ("from_pinned", "pinned -> malloc (resident)", None),
                                 ("from_pinned_malloc", "pinned -> a new malloc each time", "bounce_fresh_gbps"),
                                 ("from_pinned_mmap", "pinned -> fresh mmap (never touched)", "bounce_fresh_gbps")):
            a, b = d.med("bounce", "plain", "gbps", op=op), d.med("bounce", "shim", "gbps", op=op)
            rows.append([what, f2(a), f2(b), f2(ratio(b, a), "x")])
            if target:
                gbps_check(f"memcpy {d.size_of('bounce', default='')} {what}: GB/s with shim".replace("  ", " "),
                           b, TARGETS[target], "bounce",
                           f" (without: {f2(a)})")
        body.append(table(["memcpy", "without shim", "with shim", "speedup"], rows))
        body.append("")

    if gpu != "none" and ran("jax"):
        body.append(f"## JAX ({d.size_of('jax')}, GB/s)")
        body.append("")
        rows = []
        for op, what, target in (("device_put", "jax.device_put(numpy array)", "jax_put_gbps"),
                                 ("asarray", "np.asarray(jax array), a fresh one each time", "jax_get_gbps")):
            a, b = d.med("jax", "plain", "gbps", op=op), d.med("jax", "shim", "gbps", op=op)
            rows.append([what, f2(a), f2(b), f2(ratio(b, a), "x")])
            gbps_check(f"JAX {what}: GB/s with shim", b, TARGETS[target], "jax", f" (without: {f2(a)})")
        if any(r[1] != "-" for r in rows):
            body.append(table(["operation", "without shim", "with shim", "speedup"], rows))
        else:
            body.append(f"Not measured ({d.why_missing('jax')}).")
        body.append("")

    # ---------------------------------------------------------------- malloc
    body.append("## malloc/free and small-copy cost of the hooks (CPU), median ns per operation")
    body.append("")
    mtab = os.path.join(outdir, "malloc", "malloc_overhead.md")
    if os.path.isfile(mtab):
        with open(mtab, encoding="utf-8") as f:
            body.append(f.read().rstrip())
        body.append("")
        body.append("(\"added\" = with the shim preloaded minus without. "
                    "copy_* rows: one sync copy against bench/null_driver, whose copies return at "
                    "once, so the added time is all the shim's own work on a small copy; no target. "
                    "memcpy_*/memmove_*/memset_* rows: one 64-byte call, through a function pointer (_ptr) "
                    "or a direct call of a size the compiler cannot see (_call); target below.)")
    else:
        body.append("Not measured (bench/run_malloc_bench.sh produced no table).")
    body.append("")
    mplain = os.path.join(outdir, "malloc", "malloc.plain.txt")
    mshim = os.path.join(outdir, "malloc", "malloc.full.txt")
    heap_lines = heap_report(parse_result_lines(mplain), parse_result_lines(mshim), checks)
    if heap_lines:
        body.append("## Programs that never copy to a GPU: malloc + touch + free (CPU; shim in mode full)")
        body.append("")
        body += heap_lines

    # ---------------------------------------------------------------- what the shim did
    eff = shim_effect_rows(d, merge)
    if eff:
        body.append("## What the shim did (its stats, middle shim run of each benchmark)")
        body.append("")
        body.append("Share of the host-side bytes of all copies that took each path.")
        body.append("")
        body.append(table(["benchmark", "H2D / D2H bytes", "promoted", "staged", "pinned by program",
                           "left pageable", "sync->async", "promotions/evictions/failures"], eff))
        body.append("")
    times = shim_time_rows(d, merge)
    if times:
        body.append("Where the time went, seconds in the process: the shim's staging (its copy threads' "
                    "CPU copies / its waits for a buffer's DMA), its own registrations, the program's "
                    "memcpy calls its copy threads shared, and the program's own pinning calls.")
        body.append("")
        body.append(table(["benchmark", "staging s (CPU / wait)", "shim register / unregister s",
                           "shared memcpy: calls, bytes, s", "program host allocs / s; frees / s",
                           "program registers / s; unregisters / s"], times))
        body.append("")

    traced = trace_rows(d.raw)
    if traced:
        body.append("## Traced runs (PINSHIM_TRACE): events by kind")
        body.append("")
        body.append("Each traced run's lines grouped by event (copies by direction, path and why; memcpy calls "
                    "shared or why not), slowest group first: count, bytes, summed duration (threads "
                    "overlap, so a sum may exceed the run's time) and bytes over that duration.")
        body.append("")
        body.append(table(["run", "event", "count", "bytes", "seconds", "GB/s"], traced))
        body.append("")

    ab = os.path.join(outdir, "ab_train_realloc.md")
    if os.path.isfile(ab) and os.path.getsize(ab) > 0:
        body.append("## pinshim-ab on the alloc-copy-free loop")
        body.append("")
        with open(ab, encoding="utf-8") as f:
            body.append(f.read().rstrip())
        body.append("")

    # ---------------------------------------------------------------- runs
    if d.runs:
        body.append("## Runs")
        body.append("")
        rows = []
        seen = []
        for r in d.runs:
            if (r["case"], r["side"]) not in seen:
                seen.append((r["case"], r["side"]))
        for case, side in seen:
            rs = [r for r in d.runs if r["case"] == case and r["side"] == side]
            ok = sum(1 for r in rs if r["rc"] == 0)
            skipped = sum(1 for r in rs if r["rc"] == 77)
            failed = [r for r in rs if r["rc"] not in (0, 77)]
            note = ""
            if failed:
                try:
                    with open(os.path.join(d.raw, failed[0]["stderr"]), encoding="utf-8",
                              errors="replace") as f:
                        lines = [l.strip() for l in f if l.strip()]
                    note = (lines[-1] if lines else "")[:120].replace("|", "/")
                except OSError:
                    pass
                note = f"exit {failed[0]['rc']}: {note}"
            rows.append([case, side, ok, skipped, len(failed),
                         f"{statistics.median(r['seconds'] for r in rs):.1f}", note])
        body.append(table(["benchmark", "side", "ok", "skipped", "failed", "wall s (median)", "first failure"], rows))
        body.append("")

    md.append("## Against the targets")
    md.append("")
    if checks.rows:
        md.append(table(["what", "measured", "target", "result", "note"], checks.rows))
    else:
        md.append("Nothing GPU-related was measured.")
    md.append("")
    md += body

    with open(os.path.join(outdir, "summary.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(md).rstrip() + "\n")

    keys = []
    for r in d.records:
        for k in r:
            if k not in keys and k not in ("case", "side", "rep"):
                keys.append(k)
    with open(os.path.join(outdir, "results.csv"), "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["case", "side", "rep"] + keys)
        for r in d.records:
            w.writerow([r["case"], r["side"], r["rep"]] + [r.get(k, "") for k in keys])
    with open(os.path.join(outdir, "results.json"), "w", encoding="utf-8") as f:
        json.dump({"env": d.env, "targets": TARGETS, "runs": d.runs, "results": d.records,
                   "checks": [dict(zip(["what", "measured", "target", "result", "note"], c))
                              for c in checks.rows]}, f, indent=1)
    print(f"summarize: wrote {os.path.join(outdir, 'summary.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
