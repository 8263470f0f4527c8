"""A small GPT in plain PyTorch (pre-norm blocks, causal attention, GELU MLP, untied head),
batches of a token corpus, and a synthetic Markov corpus made in torch alone: the model of the
Python tests and of the example."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.fc = nn.Linear(n_embd, 4 * n_embd)
        self.fc_out = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.shape[-1])
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.fc_out(F.gelu(self.fc(self.ln_2(x))))


class TinyGPT(nn.Module):
    def __init__(self, vocab=64, block=32, n_embd=32, n_head=4, n_layer=2, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab, bias=False)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx):
        t = idx.shape[-1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln_f(x))


def cross_entropy(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class CorpusBatches:
    """Random windows of the corpus: step t's batch is [workers, batch, block] inputs and targets,
    from a generator seeded by (seed, t), so any loop draws the same ones."""

    def __init__(self, tokens, workers, batch, block, seed=1):
        self.tokens = torch.from_numpy(tokens.astype("int64"))
        self.workers, self.batch, self.block, self.seed = workers, batch, block, seed

    def __call__(self, step):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        starts = torch.randint(0, self.tokens.numel() - self.block - 1, (self.workers * self.batch,), generator=g)
        windows = torch.stack([self.tokens[s:s + self.block + 1] for s in starts.tolist()])
        windows = windows.view(self.workers, self.batch, self.block + 1)
        return windows[..., :-1], windows[..., 1:]


def markov_corpus(vocab=64, successors=3, concentration=0.9, seed=1, tokens=400_000):
    """A token stream in which each token is followed by one of `successors` tokens of its own,
    the first with probability `concentration`: learnable structure for a small model, made
    without scape's extension (scape.synthetic_corpus is the C++ core's corpus)."""
    g = torch.Generator().manual_seed(seed)
    table = torch.stack([torch.randperm(vocab, generator=g)[:successors] for _ in range(vocab)])
    weights = torch.full((successors,), (1 - concentration) / max(1, successors - 1))
    weights[0] = concentration if successors > 1 else 1.0
    choice = torch.multinomial(weights, tokens, replacement=True, generator=g).tolist()
    rows = table.tolist()
    out, current = [], 0
    for c in choice:
        out.append(current)
        current = rows[current][c]
    return torch.tensor(out, dtype=torch.int64).numpy()
