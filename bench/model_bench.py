#!/usr/bin/env python3
"""A model's cold copies: model.to("cuda") and checkpoint-style state_dict copies to the CPU.

  model_bench.py [--model gpt2|mlp] [--layers 24] [--embd 1024] [--heads 16] [--checkpoints 3]
                 [--quick] [--device cuda|cpu] [--pinned]

Builds a GPT-2-medium-sized model on the CPU from its configuration alone (transformers'
GPT2LMHeadModel(GPT2Config(n_layer=24, n_embd=1024, n_head=16)): about 1.4 GB of fp32
parameters in about 290 tensors, nothing downloaded), then times
  to_cuda         model.to("cuda") once, the model's first move (GB/s: the bytes of its
                  parameters and buffers over the time, torch.cuda.synchronize() included)
  state_dict_cpu  {k: v.to("cpu") for k, v in model.state_dict().items()}, --checkpoints times
                  (a fresh CPU copy each time, as a checkpoint is written); median GB/s, and the
                  first
and checks sampled tensors against the CPU originals.  --pinned: the same program's ceiling, run
without the shim: the model's CPU tensors pinned (Tensor.pin_memory()) before model.to, and each
checkpoint copied into pinned tensors allocated before the timing (ops to_cuda_pinned and
state_dict_pinned): what the framework's own per-tensor work leaves of the link's speed.  --model mlp: a stack of Linear layers of
about the same size, for a machine without transformers.  --device cpu runs the same steps
without a GPU (a dry run of the script; its figures mean nothing).  --quick: a small model.

Prints "RESULT bench=model op=... gbps=..." lines.  Exits 77 (skipped) if torch or transformers
does not import or there is no GPU; 1 if a check fails.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import pybench as pb  # noqa: E402

WHO = "model_bench"


def build_gpt2(args):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # configuration only: never a download
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    transformers = pb.need(WHO, "transformers")
    config = transformers.GPT2Config(n_layer=args.layers, n_embd=args.embd, n_head=args.heads)
    return transformers.GPT2LMHeadModel(config)


def build_mlp(torch, args):
    """Embedding, then per layer LayerNorm + Linear(embd, 4 embd) + Linear(4 embd, embd) +
    Linear(embd, 3 embd) + Linear(embd, embd): GPT-2's per-layer shapes without attention."""
    nn = torch.nn
    e = args.embd
    layers = [nn.Embedding(50257, e)]
    for _ in range(args.layers):
        layers += [nn.LayerNorm(e), nn.Linear(e, 3 * e), nn.Linear(e, e), nn.LayerNorm(e),
                   nn.Linear(e, 4 * e), nn.Linear(4 * e, e)]
    return nn.Sequential(*layers)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("gpt2", "mlp"), default="gpt2")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--embd", type=int, default=None)
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--checkpoints", type=int, default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--pinned", action="store_true")
    args = ap.parse_args()
    small = {"layers": 2, "embd": 256, "heads": 4, "checkpoints": 2}
    full = {"layers": 24, "embd": 1024, "heads": 16, "checkpoints": 3}
    for k, v in (small if args.quick else full).items():
        if getattr(args, k) is None:
            setattr(args, k, v)

    torch = pb.need_torch_cuda(WHO, args.device)
    dev = torch.device(args.device)
    torch.manual_seed(0)
    model = build_gpt2(args) if args.model == "gpt2" else build_mlp(torch, args)
    model.eval()
    # The GPU context and the caching allocator's first block, before any timing.
    torch.ones(1 << 20, device=dev).sum().item()
    pb.torch_sync(torch, args.device)

    # Unique tensors (tied weights count once: parameters() and buffers() skip repeats).
    tensors = list(model.parameters()) + list(model.buffers())
    up_bytes = sum(t.numel() * t.element_size() for t in tensors)
    names = [n for n, _ in model.named_parameters()]
    sample = sorted({names[0], names[len(names) // 2], names[-1]})
    params = dict(model.named_parameters())
    reference = {n: params[n].detach().clone() for n in sample}
    pb.say(f"{WHO}: {args.model} with {len(tensors)} tensors, {up_bytes / 1e9:.3f} GB")
    suffix = ""
    if args.pinned and args.device != "cpu":
        suffix = "_pinned"
        # Tied weights are one Parameter: pinning its data once serves both names.
        for p in model.parameters():
            p.data = p.data.pin_memory()
        for m in model.modules():
            for n, b in list(m._buffers.items()):
                if b is not None:
                    m._buffers[n] = b.pin_memory()

    pb.torch_sync(torch, args.device)
    t0 = pb.now()
    model.to(dev)
    pb.torch_sync(torch, args.device)
    secs = pb.now() - t0
    rc = 0
    params = dict(model.named_parameters())
    for n in sample:
        if not torch.equal(params[n].detach().cpu(), reference[n]):
            print(f"{WHO}: MISMATCH: parameter {n} differs after model.to({args.device!r})", file=sys.stderr)
            rc = 1
    pb.say(f"{WHO}: model.to({args.device!r}): {secs:.3f} s, {up_bytes / secs / 1e9:.2f} GB/s")
    pb.result("model", op="to_cuda" + suffix, model=args.model, tensors=len(tensors), bytes=up_bytes,
              seconds=secs, gbps=up_bytes / secs / 1e9, ok=rc == 0)

    times = []
    down_bytes = count = 0
    into = None
    if suffix:
        into = {k: torch.empty(v.shape, dtype=v.dtype).pin_memory() for k, v in model.state_dict().items()}
    for i in range(args.checkpoints):
        pb.torch_sync(torch, args.device)
        t0 = pb.now()
        if into is None:
            sd = {k: v.to("cpu") for k, v in model.state_dict().items()}
        else:
            sd = {k: into[k].copy_(v) for k, v in model.state_dict().items()}
        pb.torch_sync(torch, args.device)
        times.append(pb.now() - t0)
        down_bytes = sum(v.numel() * v.element_size() for v in sd.values())
        count = len(sd)
        for n in sample:
            if n in sd and not torch.equal(sd[n], reference[n]):
                print(f"{WHO}: MISMATCH: state_dict()[{n!r}] differs from the original", file=sys.stderr)
                rc = 1
        pb.say(f"{WHO}: checkpoint {i + 1}: {count} tensors, {times[-1]:.3f} s, "
               f"{down_bytes / times[-1] / 1e9:.2f} GB/s")
        del sd
    f = pb.gbps_fields(down_bytes, times)
    pb.result("model", op="state_dict_cpu" if not suffix else "state_dict_pinned", model=args.model, tensors=count, bytes=down_bytes,
              gbps_first=down_bytes / times[0] / 1e9, ok=rc == 0, **f)
    return rc


if __name__ == "__main__":
    sys.exit(main())
