"""The small model and per-worker data that the torchrun worker and the tests share."""
import torch

IN, HIDDEN, OUT, BATCH = 8, 16, 4, 6


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUT))


def batch(step: int, worker: int):
    g = torch.Generator().manual_seed(1000 * step + worker)
    x = torch.randn(BATCH, IN, generator=g)
    y = torch.randn(BATCH, OUT, generator=g)
    return x, y


def loss_of(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)
