#!/usr/bin/env python3
"""torch_check.py: PyTorch host<->device copies under the shim, data verified with torch.equal.

Usage:
  torch_check.py            full check (prints PASS lines; SKIP if torch or a GPU is missing)
  torch_check.py --count N  a controlled copy sequence: one warm-up round, then N rounds, each
                            of exactly 10 H2D and 10 D2H copies (one cudaMemcpyAsync per
                            .cuda()/.to()/.cpu()/copy_).  Prints
                            EXPECTED_COPIES h2d=10N d2h=10N, the copies of the N extra rounds:
                            run_gpu_tests.sh runs N=0 and N=3 under PINSHIM_MODE=observe and
                            checks that the difference of the JSON counts is exactly that (PyTorch
                            makes copies of its own at start-up, the same in both runs).

Full check:
  roundtrip       .cuda() / .cpu() of pageable tensors, 4 KiB .. 256 MiB, repeated with new
                  content, a kernel in between
  pinned          pin_memory() tensors, non_blocking H2D, non_blocking D2H into pinned tensors
  nonblocking_pageable  non_blocking H2D from a pageable tensor overwritten right after the call
                  (the device must get the old data: the source was staged at return), and
                  non_blocking D2H into a pageable tensor (complete when the call returns)
  dataloader      DataLoader with pin_memory False/True, workers 0 and 2 (forked workers)
"""
import sys


def skip(why):
    print(f"SKIP torch_check: {why}")
    sys.exit(0)


try:
    import torch
except Exception as e:  # noqa: BLE001 - any import problem means: no torch here
    skip(f"torch does not import ({type(e).__name__}: {e})")

try:
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        skip("no CUDA device visible to torch")
except Exception as e:  # noqa: BLE001
    skip(f"torch.cuda unusable ({e})")

MiB = 1 << 20
SIZES = [4 * 1024, 64 * 1024, 1 * MiB, 16 * MiB, 256 * MiB]


def fail(msg):
    print(f"FAIL torch_check: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def pattern(nbytes, seed):
    """int32 tensor with position- and seed-dependent values (small enough for x*3+1)."""
    n = nbytes // 4
    return (torch.arange(n, dtype=torch.int32) * 7 + seed * 1000003) % 1000003


def check(cond, msg):
    if not cond:
        fail(msg)


# ----- the counted sequence -------------------------------------------------------------------
def counted_round(bufs, rnd):
    """Exactly 2 H2D and 2 D2H copies per size."""
    for nbytes, (x, xp, outp) in bufs.items():
        torch.add(x, rnd, out=x)                   # new content (CPU only)
        g = x.cuda()                               # H2D 1 (pageable)
        c = (g * 3 + 1).cpu()                      # D2H 1 (fresh pageable tensor)
        check(torch.equal(c, x * 3 + 1), f"count round {rnd}: .cuda()/.cpu() of {nbytes} bytes")
        xp.copy_(x)                                # CPU copy into pinned memory
        gp = xp.to("cuda", non_blocking=True)      # H2D 2 (pinned)
        outp.copy_(gp, non_blocking=True)          # D2H 2 (into pinned)
        torch.cuda.synchronize()
        check(torch.equal(outp, x), f"count round {rnd}: pinned non_blocking of {nbytes} bytes")


def run_count(n):
    torch.cuda.init()
    bufs = {}
    for nb in SIZES:
        x = pattern(nb, 1)
        bufs[nb] = (x, torch.empty_like(x).pin_memory(), torch.empty_like(x).pin_memory())
    counted_round(bufs, 0)  # warm-up: allocator pools, lazy module loading, events
    torch.cuda.synchronize()
    for r in range(1, n + 1):
        counted_round(bufs, r)
    torch.cuda.synchronize()
    per_round = 2 * len(SIZES)
    print(f"PASS torch_check.count rounds={n}")
    print(f"EXPECTED_COPIES h2d={per_round * n} d2h={per_round * n}", flush=True)


# ----- full check -----------------------------------------------------------------------------
def roundtrip():
    for rep in range(3):
        for nb in SIZES:
            x = pattern(nb, rep + 10)
            g = x.cuda()
            y = (g * 3 + 1).cpu()
            check(torch.equal(y, x * 3 + 1), f"roundtrip rep {rep} {nb} bytes")
            # and back again from a kept tensor (hot) through .to()
            z = y.to("cuda")
            w = z.to("cpu")
            check(torch.equal(w, y), f"roundtrip .to() rep {rep} {nb} bytes")
    print("PASS torch_check.roundtrip", flush=True)


def pinned():
    for nb in SIZES:
        x = pattern(nb, 20).pin_memory()
        check(x.is_pinned(), "pin_memory() tensor not pinned")
        for rep in range(3):
            torch.add(x, 1, out=x)
            g = x.to("cuda", non_blocking=True)
            out = torch.empty_like(x, pin_memory=True)
            out.copy_(g * 2, non_blocking=True)
            torch.cuda.synchronize()
            check(torch.equal(out, x * 2), f"pinned rep {rep} {nb} bytes")
    print("PASS torch_check.pinned", flush=True)


def nonblocking_pageable():
    for nb in [64 * 1024, 16 * MiB, 256 * MiB]:
        x = pattern(nb, 30)
        for _ in range(4):  # make it hot
            x.cuda()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            for rep in range(3):
                expect = x.clone()
                torch.cuda._sleep(20_000_000)  # keep the stream busy (~10+ ms of GPU cycles)
                g = x.to("cuda", non_blocking=True)
                x.fill_(-7)  # the source was staged when the call returned
                s.synchronize()
                check(torch.equal(g.cpu(), expect), f"non_blocking H2D from pageable, {nb} bytes, rep {rep}")
                x.copy_(expect)
                # non_blocking D2H into a pageable tensor: complete at return (the call blocks)
                dst = torch.zeros_like(x)
                h = (g + 5)
                torch.cuda._sleep(20_000_000)
                dst.copy_(h, non_blocking=True)
                check(torch.equal(dst, expect + 5), f"non_blocking D2H into pageable not complete at return, {nb} bytes")
                s.synchronize()
    print("PASS torch_check.nonblocking_pageable", flush=True)


class _DS(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.arange(3 * 64 * 64, dtype=torch.float32).reshape(3, 64, 64) + i * 1000.0, i


def dataloader():
    ds = _DS()
    for workers in (0, 2):
        for pin in (False, True):
            dl = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=workers, pin_memory=pin)
            seen = 0
            for epoch in range(2):
                for b, idx in dl:
                    if pin:
                        check(b.is_pinned(), "pin_memory=True batch not pinned")
                    g = b.to("cuda", non_blocking=pin)
                    back = (g * 2).cpu()
                    expect = torch.stack([ds[int(i)][0] for i in idx]) * 2
                    check(torch.equal(back, expect), f"DataLoader workers={workers} pin={pin}")
                    seen += b.shape[0]
            check(seen == 128, f"DataLoader saw {seen} items")
            print(f"PASS torch_check.dataloader workers={workers} pin_memory={pin}", flush=True)


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "--count":
        run_count(int(sys.argv[2]))
        return
    torch.cuda.init()
    roundtrip()
    pinned()
    nonblocking_pageable()
    dataloader()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
