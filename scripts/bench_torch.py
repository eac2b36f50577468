#!/usr/bin/env python3
"""PyTorch baselines for issue 5's figures (tooling only; never a dependency of the product).

Times, on one device, the same model and batch as bench/kernels_bench.cc (MLP 784-128-10,
batch 256, SGD with momentum 0.9, lr 0.05, softmax cross-entropy, float32):

  eager      one eager-mode training step (forward, backward, optimizer step)
  ghost      DP-SGD with per-example clipping by hand-written ghost norms (||g_i||^2 =
             ||d_i||^2 (||a_i||^2 + 1) per dense layer), Gaussian noise z = 1, C = 1
  vmap       DP-SGD with torch.func vmap(grad) per-example gradients, clipping and the same noise

and prints examples/s for each and their ratios to eager. Run it on the machine that ran
kernels_bench (scripts/gpu_figures.sh does both):

  python3 scripts/bench_torch.py --device cuda [--steps 200]

With --mlp-steps it instead times issue 19's one-process CPU figures, the eager SGD step (forward,
backward, step; momentum 0.9, lr 0.05) of the MLPs of bench/train_bench.cc's BM_MlpStep:
784-256-128-10 at batch 64 and 128 and 784-2048-2048-10 at batch 64, printing one line per case,
`mlp_step <widths> <batch> <examples/s>`, the median of --repetitions timings
(scripts/cpu_figures.sh runs both and prints the ratios):

  python3 scripts/bench_torch.py --device cpu --threads 1 --mlp-steps
"""
import argparse
import time

import torch
import torch.nn.functional as F

BATCH, STEPS_PER_SYNC = 256, 16
LR, MOMENTUM, Z, C = 0.05, 0.9, 1.0, 1.0


def make_model(device):
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 10)).to(device)


def batches(device):
    g = torch.Generator(device="cpu").manual_seed(4)
    x = torch.rand(8192, 784, generator=g).to(device)
    y = (torch.arange(8192) % 10).to(device)
    k = 0
    while True:
        start = (k * BATCH) % (8192 - BATCH + 1)
        yield x[start:start + BATCH], y[start:start + BATCH]
        k += 1


def eager_step(model, opt, x, y):
    opt.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    opt.step()


def ghost_step(model, opt, x, y):
    """Per-example clipping with ghost norms: one batched backward, rows of dL/dz rescaled."""
    fc0, fc1 = model[0], model[2]
    a0 = x
    z0 = fc0(a0)
    a1 = torch.relu(z0)
    z1 = fc1(a1)
    loss = F.cross_entropy(z1, y, reduction="sum")
    d1, d0 = torch.autograd.grad(loss, (z1, z0))
    sq = (d1.square().sum(1) * (a1.square().sum(1) + 1) +
          d0.square().sum(1) * (a0.square().sum(1) + 1))
    factor = torch.clamp(C / (sq.sqrt() + 1e-12), max=1.0)
    d1, d0 = d1 * factor[:, None], d0 * factor[:, None]
    grads = [d0.T @ a0, d0.sum(0), d1.T @ a1, d1.sum(0)]
    params = [fc0.weight, fc0.bias, fc1.weight, fc1.bias]
    for p, g in zip(params, grads):
        p.grad = (g + Z * C * torch.randn_like(g)) / BATCH
    opt.step()


def make_vmap_step(model):
    from torch.func import functional_call, grad, vmap  # torch >= 2.0 (the CPU figures need less)

    def loss_of(p, x, y):
        out = functional_call(model, p, (x[None],))
        return F.cross_entropy(out, y[None])

    per_example = vmap(grad(loss_of), in_dims=(None, 0, 0))

    def step(model, opt, x, y):
        p = {k: v.detach() for k, v in model.named_parameters()}
        g = per_example(p, x, y)
        flat = torch.cat([v.reshape(BATCH, -1) for v in g.values()], dim=1)
        factor = torch.clamp(C / (flat.norm(dim=1) + 1e-12), max=1.0)
        for name, param in model.named_parameters():
            s = (g[name] * factor.view(-1, *[1] * (g[name].dim() - 1))).sum(0)
            param.grad = (s + Z * C * torch.randn_like(s)) / BATCH
        opt.step()

    return step


def time_step(step, device, steps):
    model = make_model(device)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    if step is None:
        step = make_vmap_step(model)
    data = batches(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(20):  # warm-up (allocator, kernels, vmap tracing)
        step(model, opt, *next(data))
    sync()
    start = time.perf_counter()
    done = 0
    while done < steps:
        for _ in range(STEPS_PER_SYNC):
            step(model, opt, *next(data))
        sync()
        done += STEPS_PER_SYNC
    return done * BATCH / (time.perf_counter() - start)


# (hidden widths, batch, steps per timing): the cases of bench/train_bench.cc's BM_MlpStep.
MLP_STEP_CASES = [((256, 128), 64, 64), ((256, 128), 128, 32), ((2048, 2048), 64, 32)]


def mlp_step_rate(hidden, batch, steps, device):
    """Examples/s of eager SGD steps of a 784-<hidden>-10 MLP, `steps` steps per timing."""
    torch.manual_seed(5)
    widths = [784, *hidden, 10]
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    g = torch.Generator(device="cpu").manual_seed(4)
    rows = batch * steps
    x = torch.rand(rows, 784, generator=g).to(device)
    y = (torch.arange(rows) % 10).to(device)
    for k in range(min(steps, 8)):  # warm-up
        eager_step(model, opt, x[k * batch:(k + 1) * batch], y[k * batch:(k + 1) * batch])
    start = time.perf_counter()
    for k in range(steps):
        eager_step(model, opt, x[k * batch:(k + 1) * batch], y[k * batch:(k + 1) * batch])
    return rows / (time.perf_counter() - start)


def mlp_steps(device, repetitions):
    for hidden, batch, steps in MLP_STEP_CASES:
        rates = sorted(mlp_step_rate(hidden, batch, steps, device) for _ in range(repetitions))
        widths = "-".join(str(w) for w in (784, *hidden, 10))
        print(f"mlp_step {widths} {batch} {rates[len(rates) // 2]:.1f}", flush=True)


def make_cnn():
    """examples/fashion_mnist_cnn.yaml's CNN (bench/train_bench.cc's BM_CnnStep)."""
    torch.manual_seed(5)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * 7 * 7, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 10))


def cnn_step_rate(batch, steps, dp):
    """Examples/s of the CNN's eager SGD step, or (dp) of Opacus-style DP-SGD: per-example
    gradients by vmap(grad), clipping to 1 and Gaussian noise z = 1."""
    model = make_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    g = torch.Generator(device="cpu").manual_seed(4)
    rows = batch * steps
    x = torch.rand(rows, 1, 28, 28, generator=g)
    y = torch.arange(rows) % 10
    step = eager_step
    if dp:
        try:
            from torch.func import functional_call, grad, vmap
        except ImportError:  # PyTorch < 2.0: functorch
            from functorch import grad, vmap
            from torch.nn.utils.stateless import functional_call

        def loss_of(p, xi, yi):
            out = functional_call(model, p, (xi.unsqueeze(0),))
            return F.cross_entropy(out, yi.unsqueeze(0))

        per_example = vmap(grad(loss_of), in_dims=(None, 0, 0))

        def step(model, opt, xb, yb):
            params = {k: v.detach() for k, v in model.named_parameters()}
            grads = per_example(params, xb, yb)
            norms = torch.sqrt(sum(gr.flatten(1).pow(2).sum(1) for gr in grads.values()))
            factors = (C / (norms + 1e-6)).clamp(max=1.0)
            for name, p in model.named_parameters():
                gsum = torch.einsum("i,i...->...", factors, grads[name])
                p.grad = (gsum + Z * C * torch.randn_like(gsum)) / xb.shape[0]
            opt.step()
    for k in range(min(steps, 4)):  # warm-up
        step(model, opt, x[k * batch:(k + 1) * batch], y[k * batch:(k + 1) * batch])
    start = time.perf_counter()
    for k in range(steps):
        step(model, opt, x[k * batch:(k + 1) * batch], y[k * batch:(k + 1) * batch])
    return rows / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--threads", type=int, default=0,
                        help="torch.set_num_threads (0: PyTorch's default)")
    parser.add_argument("--mlp-steps", action="store_true",
                        help="time the one-process MLP steps of bench/train_bench.cc instead")
    parser.add_argument("--cnn-steps", action="store_true",
                        help="time the CNN's SGD and vmap DP-SGD steps of bench/train_bench.cc")
    parser.add_argument("--repetitions", type=int, default=5)
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.cnn_steps:
        for dp in (False, True):
            rates = sorted(cnn_step_rate(64, 16, dp) for _ in range(args.repetitions))
            print(f"cnn_step {'vmap_dp' if dp else 'sgd'} 64 {rates[len(rates) // 2]:.1f}",
                  flush=True)
        return
    if args.mlp_steps:
        print(f"# torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
              f"CPU capability {torch.backends.cpu.get_cpu_capability()}"
              if hasattr(torch.backends, "cpu") else f"# torch {torch.__version__}", flush=True)
        mlp_steps(device, args.repetitions)
        return
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    eager = time_step(eager_step, device, args.steps)
    ghost = time_step(ghost_step, device, args.steps)
    vm = time_step(None, device, max(STEPS_PER_SYNC, args.steps // 4))
    print(f"torch {torch.__version__} on {name}, MLP 784-128-10 batch {BATCH}")
    print(f"eager SGD step:          {eager:12.0f} examples/s")
    print(f"DP-SGD, ghost norms:     {ghost:12.0f} examples/s  (time ratio to eager {eager / ghost:.2f})")
    print(f"DP-SGD, torch.func vmap: {vm:12.0f} examples/s  (time ratio to eager {eager / vm:.2f})")


if __name__ == "__main__":
    main()
