#!/usr/bin/env python3
"""PyTorch transfer benchmarks (run plain and under the shim by bench/run_bench.sh).

  torch_bench.py dataloader [--pin-memory] [--batches 40] [--batch-size 64] [--warmup 3]
                            [--workers 0] [--prefetch 2]
      A DataLoader-fed loop (synthetic Dataset of 3x224x224 float32 images made by --workers
      worker processes, or by the main process with 0; from workers, each batch reaches the
      main process in shared memory):
      each batch goes to the GPU with .to("cuda", non_blocking=True), a small reduction runs on
      it and its result is checked (.item(), as a training loop reads its loss).
  torch_bench.py transfer [--size 512M] [--reps 10]
      tensor.cuda() of a pageable CPU tensor, .cpu() of a CUDA tensor (a fresh CPU tensor each
      time), and, for reference, .cuda() of a pinned tensor; median GB/s of each.

Prints "RESULT bench=torch_... key=value ..." lines.  Exits 77 (skipped) if torch does not
import or sees no GPU; 1 if a check fails.
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


def load_torch(device="cuda"):
    try:
        import torch
    except Exception as e:  # ImportError, or a broken install
        print(f"SKIP torch_bench: torch does not import ({e.__class__.__name__}: {e})")
        sys.exit(SKIP)
    if device != "cpu" and not torch.cuda.is_available():
        print("SKIP torch_bench: torch sees no CUDA device")
        sys.exit(SKIP)
    return torch


def dataloader(args):
    torch = load_torch(args.device)
    from torch.utils.data import DataLoader, Dataset

    class Synthetic(Dataset):
        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

        def __getitem__(self, idx):
            # A cheap, checkable image: every element equals idx % 251.
            return torch.full((3, 224, 224), float(idx % 251), dtype=torch.float32), idx

    total = args.batches + args.warmup
    extra = {"prefetch_factor": args.prefetch} if args.workers > 0 else {}
    loader = DataLoader(Synthetic(total * args.batch_size), batch_size=args.batch_size,
                        shuffle=False, num_workers=args.workers, pin_memory=args.pin_memory,
                        **extra)
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if args.device != "cpu" else (lambda: None)
    sync()
    batch_bytes = args.batch_size * 3 * 224 * 224 * 4
    t0 = None
    for i, (x, idx) in enumerate(loader):
        if i == args.warmup:
            sync()
            t0 = time.perf_counter()
        xd = x.to(dev, non_blocking=True)
        got = xd[:, 0, 0, 0].sum().item()  # the "loss": forces the copy to have landed
        want = float(sum(int(j) % 251 for j in idx))
        if got != want:
            print(f"torch_bench: MISMATCH in batch {i}: {got} != {want}", file=sys.stderr)
            return 1
    sync()
    secs = time.perf_counter() - t0
    bps = args.batches / secs
    print(f"torch dataloader pin_memory={args.pin_memory} workers={args.workers}: "
          f"{bps:.3f} batches/s", file=sys.stderr)
    print(f"RESULT bench=torch_dataloader pin_memory={int(args.pin_memory)} workers={args.workers} "
          f"batches={args.batches} batch_bytes={batch_bytes} seconds={secs:.6f} "
          f"batches_per_s={bps:.4f} gbps={bps * batch_bytes / 1e9:.4f} ok=1")
    return 0


def timed(torch, fn, reps):
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        r = fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
        del r
    return out


def transfer(args):
    torch = load_torch()
    n = parse_size(args.size)
    elems = n // 4
    host = torch.empty(elems, dtype=torch.float32).fill_(3.0)
    dev_t = torch.full((elems,), 5.0, dtype=torch.float32, device="cuda")
    rc = 0

    def report(name, secs):
        med = statistics.median(secs)
        gbps = n / med / 1e9
        print(f"torch {name} {n >> 20} MiB: {gbps:.2f} GB/s", file=sys.stderr)
        print(f"RESULT bench=torch_transfer op={name} bytes={n} reps={len(secs)} "
              f"seconds_median={med:.6f} gbps={gbps:.4f} gbps_min={n / max(secs) / 1e9:.4f} "
              f"gbps_max={n / min(secs) / 1e9:.4f}")

    for _ in range(2):  # warm-up (under the shim: promotion)
        host.cuda()
        dev_t.cpu()
    report("cuda", timed(torch, lambda: host.cuda(), args.reps))
    report("cpu", timed(torch, lambda: dev_t.cpu(), args.reps))
    pinned = host.pin_memory()
    report("cuda_pinned", timed(torch, lambda: pinned.cuda(), args.reps))
    back = dev_t.cpu()
    if float(host.cuda()[elems - 1].item()) != 3.0 or float(back[elems // 2]) != 5.0:
        print("torch_bench: MISMATCH in transfer check", file=sys.stderr)
        rc = 1
    return rc


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    d = sub.add_parser("dataloader")
    d.add_argument("--pin-memory", action="store_true")
    d.add_argument("--batches", type=int, default=40)
    d.add_argument("--batch-size", type=int, default=64)
    d.add_argument("--warmup", type=int, default=3)
    d.add_argument("--workers", type=int, default=0)
    d.add_argument("--prefetch", type=int, default=2, help="batches each worker prepares ahead")
    d.add_argument("--device", default="cuda", help="cpu: a dry run of the loop without a GPU")
    t = sub.add_parser("transfer")
    t.add_argument("--size", default="512M")
    t.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    return dataloader(args) if args.what == "dataloader" else transfer(args)


if __name__ == "__main__":
    sys.exit(main())
