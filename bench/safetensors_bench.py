#!/usr/bin/env python3
"""safetensors checkpoint loading onto the GPU, from a file in the page cache.

  safetensors_bench.py write --path FILE [--size 1.5G] [--quick]
      Writes a checkpoint of fp32 tensors shaped like a GPT-2-medium-sized model's (hidden
      size 1024): a 200 MiB embedding, a position table, and per layer norms and biases of
      4-16 KiB and weight matrices of 4-16 MiB, as many layers as fit in --size (1.5 GiB: 27
      layers, about 330 tensors).  Each tensor holds one value, its own.  Written here in the
      format's own layout (an 8-byte header length, a JSON header, the data), so writing
      needs neither torch nor safetensors.
  safetensors_bench.py load --path FILE [--reps 3] [--device cuda|cpu]
      Reads the file once (so that it is in the page cache), then times, --reps times each:
        load_cuda       safetensors.torch.load_file(FILE, device="cuda")
        load_then_cuda  load_file(FILE), then .cuda() of every tensor (also: the CPU part alone)
      GB/s is the file's tensor bytes over the time, torch.cuda.synchronize() included; every
      tensor's first and last element is checked.  --device cpu: the same steps without a GPU
      (a dry run of the script).

Prints "RESULT bench=safetensors op=... gbps=..." lines.  Exits 77 (skipped) if torch or
safetensors does not import or there is no GPU; 1 if a check fails.
"""
import argparse
import json
import os
import statistics
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import pybench as pb  # noqa: E402

WHO = "safetensors_bench"
HIDDEN = 1024


def layout(total):
    """[(name, shape)] of fp32 tensors adding up to about `total` bytes."""
    h = HIDDEN
    vocab = max(h, min(51200, total * 2 // 15 // (h * 4)))  # 200 MiB at full size
    out = [("wte.weight", (vocab, h)), ("wpe.weight", (1024, h))]
    per_layer = [("ln_1.weight", (h,)), ("ln_1.bias", (h,)),
                 ("attn.c_attn.weight", (h, 3 * h)), ("attn.c_attn.bias", (3 * h,)),
                 ("attn.c_proj.weight", (h, h)), ("attn.c_proj.bias", (h,)),
                 ("ln_2.weight", (h,)), ("ln_2.bias", (h,)),
                 ("mlp.c_fc.weight", (h, 4 * h)), ("mlp.c_fc.bias", (4 * h,)),
                 ("mlp.c_proj.weight", (4 * h, h)), ("mlp.c_proj.bias", (h,))]

    def nbytes(shape):
        n = 4
        for d in shape:
            n *= d
        return n

    used = sum(nbytes(s) for _, s in out)
    layer_bytes = sum(nbytes(s) for _, s in per_layer)
    layers = max(1, (total - used) // layer_bytes)
    for i in range(layers):
        out += [(f"h.{i}.{n}", s) for n, s in per_layer]
    out += [("ln_f.weight", (h,)), ("ln_f.bias", (h,))]
    return out


def value_of(index):
    """The value every element of tensor number `index` holds (exact in fp32)."""
    return float(index % 97 + 1)


def write(args):
    total = pb.parse_size(args.size) if args.size else (64 << 20 if args.quick else 1536 << 20)
    tensors = layout(total)
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in tensors:
        n = 4
        for d in shape:
            n *= d
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(len(text) + 8) % 64)  # the data starts 64-byte aligned
    tmp = args.path + ".part"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for i, (name, shape) in enumerate(tensors):
            count = header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
            chunk = struct.pack("<f", value_of(i)) * min(count // 4, 1 << 22)  # <= 16 MiB at a time
            left = count
            while left:
                part = chunk[:left]
                f.write(part)
                left -= len(part)
    os.replace(tmp, args.path)
    sizes = [header[n]["data_offsets"][1] - header[n]["data_offsets"][0] for n, _ in tensors]
    pb.say(f"{WHO}: wrote {args.path}: {len(tensors)} tensors, {offset / 2**20:.1f} MiB "
           f"({min(sizes)} B .. {max(sizes) / 2**20:.0f} MiB)")
    return 0


def read_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header


def load(args):
    torch = pb.need_torch_cuda(WHO, args.device)
    st = pb.need(WHO, "safetensors.torch")
    header = read_header(args.path)
    order = sorted(header, key=lambda k: header[k]["data_offsets"][0])  # the written order
    expect = {name: value_of(i) for i, name in enumerate(order)}
    nbytes = sum(v["data_offsets"][1] - v["data_offsets"][0] for v in header.values())
    with open(args.path, "rb") as f:  # into the page cache
        while f.read(64 << 20):
            pass
    dev = torch.device(args.device)
    torch.ones(1 << 20, device=dev).sum().item()  # the GPU context, before any timing
    pb.torch_sync(torch, args.device)

    def check(loaded):
        if set(loaded) != set(expect):
            return "the loaded names differ from the file's"
        names = list(loaded)
        ends = torch.stack([loaded[n].reshape(-1)[[0, -1]] for n in names]).cpu()
        for i, n in enumerate(names):
            if ends[i, 0].item() != expect[n] or ends[i, 1].item() != expect[n] or \
                    loaded[n].device.type != dev.type:
                return f"tensor {n} holds {ends[i].tolist()} on {loaded[n].device}, not {expect[n]}"
        return None

    def load_cuda():
        return st.load_file(args.path, device=args.device), None

    def load_then_cuda():
        cpu = st.load_file(args.path)
        mid = pb.now()
        return {k: v.to(dev) for k, v in cpu.items()}, mid

    rc = 0
    for op, fn in (("load_cuda", load_cuda), ("load_then_cuda", load_then_cuda)):
        times, cpu_times = [], []
        for _ in range(args.reps):
            pb.torch_sync(torch, args.device)
            t0 = pb.now()
            loaded, mid = fn()
            pb.torch_sync(torch, args.device)
            times.append(pb.now() - t0)
            if mid is not None:
                cpu_times.append(mid - t0)
            bad = check(loaded)
            if bad:
                print(f"{WHO}: MISMATCH after {op}: {bad}", file=sys.stderr)
                rc = 1
            del loaded
        f = pb.gbps_fields(nbytes, times)
        extra = {"seconds_cpu_median": statistics.median(cpu_times)} if cpu_times else {}
        pb.say(f"{WHO}: {op}: {f['gbps']:.2f} GB/s (median of {len(times)}, "
               f"{nbytes / 2**20:.0f} MiB in {len(header)} tensors)")
        pb.result("safetensors", op=op, tensors=len(header), bytes=nbytes, ok=rc == 0, **f, **extra)
    return rc


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    w = sub.add_parser("write")
    w.add_argument("--path", required=True)
    w.add_argument("--size", default=None)
    w.add_argument("--quick", action="store_true")
    r = sub.add_parser("load")
    r.add_argument("--path", required=True)
    r.add_argument("--reps", type=int, default=3)
    r.add_argument("--device", default="cuda")
    args = ap.parse_args()
    return write(args) if args.what == "write" else load(args)


if __name__ == "__main__":
    sys.exit(main())
