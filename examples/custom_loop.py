"""Your own PyTorch training loop, with ampkit's precision policy, non-finite locator and gradient
statistics (docs/python_api.md explains each call).

    python examples/custom_loop.py                                   # fp16-mixed, 40 steps
    python examples/custom_loop.py --precision bf16-mixed
    python examples/custom_loop.py --inject layers.1.fc2:backward:inf@12   # watch the locator name it

The model and data are stand-ins for yours (any `nn.Module`, any batches): a 2-layer MLP language
model learning a fixed next-token rule over 64 tokens. Nothing here is ampkit-specific except the
lines marked `# ampkit`. The last line printed is a JSON summary (the test suite reads it).
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from torch import nn

from ampkit.diagnostics import FaultInjector, GradientStatistics, NonFiniteLocator, long_tail
from ampkit.precision import ScalerConfig, build_precision

VOCAB, WIDTH, SEQ, BATCH = 64, 64, 16, 16


class Layer(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class TinyLM(nn.Module):
    """Embedding -> residual MLP layers -> head. Parameters are named `layers.N.*`, so gradient
    statistics group them per layer."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(Layer(WIDTH) for _ in range(2))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def batch(generator: torch.Generator, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences following the rule next = (3 * token + 1) mod 64, from random starts."""
    start = torch.randint(0, VOCAB, (BATCH, 1), generator=generator)
    tokens = [start]
    for _ in range(SEQ):
        tokens.append((3 * tokens[-1] + 1) % VOCAB)
    seq = torch.cat(tokens, dim=1).to(device)
    return seq[:, :-1], seq[:, 1:]


def train(precision: str, steps: int, inject: str, log_every: int) -> dict:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    policy = build_precision(precision, device_type=device, scaler=ScalerConfig(init_scale=4096.0))  # ampkit
    model = policy.convert_module(TinyLM().to(device))  # ampkit: a no-op except for *-true precisions
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    # ampkit: per-layer gradient norms and fp16 flush/overflow forecasts, computed on the device at the end
    # of each armed backward; `drain()` moves them to the host (a sync: call it at log steps only).
    stats = GradientStatistics(model, every=log_every, scale_fn=policy.loss_scale).attach()
    # ampkit: which module first produced an inf/nan, forward or backward. A diagnostic mode: it syncs
    # per module call, so attach it while debugging (or, as here, on a small model).
    locator = NonFiniteLocator(model).attach()
    injector = FaultInjector(model, inject).attach() if inject else None  # a synthetic fault, for the demo
    generator = torch.Generator().manual_seed(0)
    losses, skipped, findings, layer_norms = [], 0, [], {}
    with policy.run_context():  # ampkit: backend flags (TF32) for the whole loop
        for step in range(1, steps + 1):
            stats.begin_step(step)
            locator.begin_step(step)
            inputs, targets = batch(generator, device)
            with policy.forward_context():  # ampkit: autocast around forward + loss only
                logits = model(inputs)
                loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
            policy.backward(loss)  # ampkit: scales the loss first under fp16-mixed
            policy.unscale_gradients(optimizer)  # ampkit: before clipping, so the clip sees true gradients
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            stepped = policy.optimizer_step(optimizer)  # ampkit: False when the scaler skipped an inf/nan step
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
            skipped += not stepped
            if locator.first_nonfinite is not None:
                f = locator.first_nonfinite
                print(f"step {step}: {f.explanation} (optimizer step {'applied' if stepped else 'skipped'})")
                findings.append({"step": f.step, "module": f.module, "phase": f.phase, "stepped": stepped})
                locator.resume()  # handled (the scaler skipped the step): keep watching
            if step % log_every == 0:
                for snapshot in stats.drain():
                    layer_norms = {layer.name: layer.norm for layer in snapshot.layers}
                scale = policy.loss_scale()
                print(
                    f"step {step}: loss {losses[-1]:.4f}, scale {scale if scale is not None else '-'}, "
                    f"layer grad norms " + ", ".join(f"{k} {v:.2e}" for k, v in layer_norms.items())
                )
    for hook in (stats, locator, injector):
        if hook is not None:
            hook.detach()
    tail = long_tail(layer_norms)  # a layer whose gradient norm is >= 100x the median's
    return {
        "precision": policy.name,
        "steps": steps,
        "first_loss": losses[0],
        "final_loss": losses[-1],
        "skipped_steps": skipped,
        "findings": findings,
        "final_loss_scale": policy.loss_scale(),
        "layer_grad_norms": layer_norms,
        "long_tail": tail.to_dict() if tail else None,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="fp16-mixed", help="an ampkit precision (fp32, bf16-mixed, ...)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--inject", default="", help="fault spec module_path:phase:kind[@step] (demo)")
    args = parser.parse_args(argv)
    summary = train(args.precision, args.steps, args.inject, args.log_every)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
