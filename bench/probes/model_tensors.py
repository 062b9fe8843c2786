#!/usr/bin/env python3
# model_tensors.py MODE: where a model's copies spend their time, by tensor size.  The GPT-2-
# medium-sized model of model_bench.py is built on the CPU; each parameter's t.to("cuda") is
# timed alone and summed in four size buckets, then its GPU tensors are copied back to the CPU
# three times (each tensor's .to("cpu") timed; every pass's tensors freed before the next, as
# a checkpoint loop does).  MODE "pinned": the CPU tensors pinned first and the copies back
# made into pinned tensors allocated outside the timing (the ceiling); any other word is a label
# (run it with LD_PRELOAD=libpinshim.so for the shim, without for the driver's pageable path).
# More words after MODE change the move to the GPU toward Module.to's: "free", each parameter's
# (and buffer's) data replaced by its copy so that its CPU memory is freed as the move goes on,
# the copy and the replacement (the free) timed apart; "fresh_device", no allocation-only pass
# before it, so that the device memory is allocated (cudaMalloc) during the move.  With both,
# the move is model.to's but for Module._apply's own bookkeeping: what each costs the move.
import os, sys, time
os.environ.setdefault("HF_HUB_OFFLINE", "1"); os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
import torch, transformers
mode = sys.argv[1] if len(sys.argv) > 1 else "pageable"
free_mode = "free" in sys.argv[2:]
fresh_device = "fresh_device" in sys.argv[2:]
torch.manual_seed(0)
m = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=24, n_embd=1024, n_head=16))
torch.ones(1 << 20, device="cuda").sum().item()
# The tensors' owners, in the order moved: a parameter, or a (module, buffer name).
owners = list(m.parameters()) + [(mod, n) for mod in m.modules() for n, b in mod._buffers.items() if b is not None]


def get(o):
    return o[0]._buffers[o[1]] if isinstance(o, tuple) else o.data


def put(o, t):
    if isinstance(o, tuple):
        o[0]._buffers[o[1]] = t
    else:
        o.data = t


ts = [get(o).detach() for o in owners] if free_mode else [t.detach() for t in list(m.parameters()) + list(m.buffers())]
if mode == "pinned":
    ts = [t.pin_memory() for t in ts]
torch.cuda.synchronize()
# allocation alone, same shapes (the caching allocator grows here; freed after)
alloc_s = 0.0
if not fresh_device:
    a0 = time.perf_counter()
    e = [torch.empty(t.shape, dtype=t.dtype, device="cuda") for t in ts]
    torch.cuda.synchronize()
    alloc_s = time.perf_counter() - a0
    del e
    torch.cuda.synchronize()
alloc_note = "device memory allocated during the move" if fresh_device else f"alloc-only pass {alloc_s*1e3:.1f} ms"
BUCKETS = ("<64K", "<1M", "<8M", ">=8M")


def bucket(n):
    return "<64K" if n < 65536 else "<1M" if n < 1 << 20 else "<8M" if n < 8 << 20 else ">=8M"


def add(buckets, n, secs):
    c, s, by = buckets.get(bucket(n), (0, 0.0, 0))
    buckets[bucket(n)] = (c + 1, s + secs, by + n)


def report(head, buckets, T):
    tot = sum(v[2] for v in buckets.values())
    print(f"{head} {tot/1e9:.3f} GB in {T*1e3:.1f} ms ({tot/T/1e9:.1f} GB/s)")
    for k in BUCKETS:
        if k in buckets:
            c, s, by = buckets[k]
            print(f"  {k:5s} n={c:4d} bytes={by/1e6:8.1f} MB  sum {s*1e3:7.2f} ms  per {s/c*1e6:7.1f} us  {by/s/1e9:6.1f} GB/s")


# Each tensor's to("cuda") timed alone.
buckets = {}
outs = []
if free_mode:
    for o, t in zip(owners, ts):
        put(o, t)   # pinned: the pinned copies become the model's (else: no change)
    ntensors, ts, t = len(ts), None, None   # the owners hold the CPU memory alone
    replaced = 0.0
    T0 = time.perf_counter()
    for o in owners:
        cur = get(o)
        n = cur.numel() * cur.element_size()
        a = time.perf_counter()
        g = cur.to("cuda")
        b = time.perf_counter()
        del cur
        put(o, g)   # the CPU memory's last reference goes: freed here
        replaced += time.perf_counter() - b
        add(buckets, n, b - a)
        outs.append(g)
    torch.cuda.synchronize()
    report(f"{mode}: to(\"cuda\") as Module.to, {ntensors} tensors ({alloc_note}; "
           f"data replaced, CPU memory freed: {replaced*1e3:.2f} ms in all):", buckets, time.perf_counter() - T0)
else:
    T0 = time.perf_counter()
    for t in ts:
        a = time.perf_counter()
        outs.append(t.to("cuda"))
        add(buckets, t.numel() * t.element_size(), time.perf_counter() - a)
    torch.cuda.synchronize()
    report(f"{mode}: to(\"cuda\"), {len(ts)} tensors ({alloc_note}):", buckets, time.perf_counter() - T0)

# Checkpoint side: each tensor's to("cpu") timed alone, three passes, each pass's tensors freed
# before the next (pinned: copied into pinned tensors allocated outside the per-tensor timing;
# the pass's whole time includes their allocation, the first pass's the pinned pool's growth).
for rep in range(3):
    buckets = {}
    torch.cuda.synchronize()
    T0 = time.perf_counter()
    sd = []
    for t in outs:
        if mode == "pinned":
            c = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            a = time.perf_counter()
            c.copy_(t)
        else:
            a = time.perf_counter()
            c = t.to("cpu")
        secs = time.perf_counter() - a
        sd.append(c)
        add(buckets, t.numel() * t.element_size(), secs)
    report(f"{mode}: to(\"cpu\") pass {rep + 1}:", buckets, time.perf_counter() - T0)
    del sd
