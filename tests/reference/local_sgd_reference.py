"""An independent numpy reference of DiLoCo, Streaming DiLoCo and SparseLoCo on the noisy quadratic.

Written from docs/algorithms.md ("DiLoCo", "SparseLoCo", "Update rules", "Synthetic gradients")
without calling the C++ core: the counter-based random numbers and the noisy quadratic, the inner
AdamW and AdamS steps, the outer loop with its fragments and one-step delay, the pseudo-gradient
all-reduce at fp32, bf16 and fp8 e5m2, and SparseLoCo's error feedback, chunked top-k and
statistical quantizer. W workers run in one process. Arithmetic is fp32 element by element with
scalars rounded to fp32 once from double, and means over workers are sums in rank order divided by
f32(W), as the page states. `run_reference` returns worker 0's parameters (the run file's
/final/params) and theta_global after the last step and, per step, the workers' mean of
||Delta_i|| and of ||theta_i - theta_bar|| at the steps that sync (NaN elsewhere), the run file's
`pseudo_grad_norm` and `param_drift`.
"""

import math

import numpy as np

from tests.reference.scape_reference import learning_rate

F32 = np.float32
U64 = np.uint64
MASK64 = (1 << 64) - 1


# ----------------------------------------------------------------------------- random numbers
def _mix(x):
    """splitmix64's finaliser on uint64 arrays (wrapping arithmetic)."""
    x = (x + U64(0x9E3779B97F4A7C15)) & U64(MASK64)
    x = (x ^ (x >> U64(30))) * U64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> U64(27))) * U64(0x94D049BB133111EB)
    return x ^ (x >> U64(31))


def derive(key, part):
    return int(_mix(np.array([key], dtype=U64) ^ _mix(np.array([part], dtype=U64)))[0])


def uniform(key, counters):
    """Uniform in [0, 1) with 53 bits, for every counter."""
    bits = _mix(U64(key) ^ _mix(np.asarray(counters, dtype=U64)))
    return (bits >> U64(11)).astype(np.float64) * 2.0 ** -53


def normal(key, counters):
    c = np.asarray(counters, dtype=U64)
    u1 = 1.0 - uniform(key, U64(2) * c)
    u2 = uniform(key, U64(2) * c + U64(1))
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2)


class NoisyQuadratic:
    """f = 1/2 sum h_j (theta_j - theta*_j)^2, Pareto curvature capped at 100, worker noise."""

    def __init__(self, n, seed, noise, tail=1.0, h_min=0.01, h_max=100.0):
        j = np.arange(n, dtype=U64)
        u = uniform(derive(seed, 1), j)
        self.h = np.minimum(h_max, h_min * (1.0 - u) ** (-1.0 / tail)).astype(F32)
        self.optimum = normal(derive(seed, 2), j).astype(F32)
        self.noise_key = derive(seed, 3)
        self.sigma = F32(noise)
        self.n = n

    def gradient(self, theta, step, worker, fused=True):
        """h (theta - theta*) + sigma sqrt(h) z. An optimised build contracts the sum into one
        fused multiply-add of the noise term (the x86-64-v3 default of cmake/isa.cmake; the
        gradient's translation unit is not built with -ffp-contract=off): sigma sqrt(h) z is exact
        in double and the sum is rounded once (to double, then to fp32: a double rounding that can
        differ from the fused one only on an exact tie). A build that does not contract (the
        debug build) rounds the product and the sum each to fp32: `fused=False`."""
        key = derive(derive(self.noise_key, step), worker)
        z = normal(key, np.arange(self.n, dtype=U64)).astype(F32)
        drift = self.h * (theta - self.optimum)
        scale = self.sigma * np.sqrt(self.h)
        if not fused:
            return drift + scale * z
        noise = scale.astype(np.float64) * z.astype(np.float64)
        return (noise + drift.astype(np.float64)).astype(F32)


# ----------------------------------------------------------------------------- wire formats
def round_bf16(x):
    bits = np.asarray(x, dtype=F32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(F32)


def round_e5m2(x):
    x = np.asarray(x, dtype=F32)
    a = np.abs(x)
    small = np.rint(a * F32(65536.0)) * F32(2.0 ** -16)
    bits = a.view(np.uint32).astype(np.uint64)
    bits = (bits + 0x000FFFFF + ((bits >> 21) & 1)) & 0xFFE00000
    large = bits.astype(np.uint32).view(F32)
    return np.copysign(np.where(a >= F32(2.0 ** -14), large, small), x).astype(F32)


def mean_over_workers(values):
    total = values[0].copy()
    for v in values[1:]:
        total = total + v
    return total / F32(len(values))


def all_reduce(deltas, wire):
    """The mean of the workers' pseudo-gradients as `outer_wire` delivers it."""
    if wire == "fp32":
        return mean_over_workers(deltas)
    if wire == "bf16":
        return round_bf16(mean_over_workers([round_bf16(d) for d in deltas]))
    peak = max(float(np.max(np.abs(d))) if d.size else 0.0 for d in deltas)
    exponent = max(math.frexp(peak)[1] - 1 - 14, -126) if peak > 0 else 0
    down, up = F32(2.0 ** -exponent), F32(2.0 ** exponent)
    return mean_over_workers([round_e5m2(d * down) for d in deltas]) * up


# ----------------------------------------------------------------------------- inner rules
def inner_step(theta, m, v, g, opt, t, total):
    """One dense AdamW or AdamS (the artifact's form) step, in place; the tensor is decayed."""
    eta = learning_rate(t, opt, total)
    b1, b2 = opt["betas"]
    c1 = 1.0 - b1 ** t
    c2 = 1.0 - b2 ** t
    decay = F32(1.0 - eta * opt["weight_decay"])
    fb1, fb2, omb1, omb2 = F32(b1), F32(b2), F32(1.0 - b1), F32(1.0 - b2)
    eps, inv_sqrt_c2 = F32(opt["eps"]), F32(1.0 / math.sqrt(c2))
    if opt["inner"] == "adamw":
        m[:] = fb1 * m + omb1 * g
        v[:] = fb2 * v + omb2 * g * g
        theta[:] = theta * decay - F32(eta / c1) * m / (np.sqrt(v) * inv_sqrt_c2 + eps)
    else:
        v_new = fb2 * m * m + omb2 * g * g
        m[:] = fb1 * m + omb1 * g
        theta[:] = theta * decay - F32(eta) * (m * F32(1.0 / c1)) / (np.sqrt(v_new) * inv_sqrt_c2 + eps)


# ----------------------------------------------------------------------------- SparseLoCo
def k_per_chunk(density, chunk):
    x = density * chunk
    nearest = round(x)
    k = nearest if abs(x - nearest) <= 1e-9 * max(1.0, x) else math.ceil(x)
    return min(chunk, max(1, int(k)))


def chunk_topk(e, chunk, k):
    """Ascending indices of the min(k, length) largest |e| of every chunk (ties to the lower index)."""
    picked = []
    for start in range(0, e.size, chunk):
        part = np.abs(e[start:start + chunk])
        order = np.argsort(-part, kind="stable")[:min(k, part.size)]
        picked.extend(sorted(start + int(i) for i in order))
    return np.array(picked, dtype=np.int64)


def quantize(values, bits):
    """Templar's statistical quantizer; returns the values it delivers."""
    n, bins = values.size, 1 << bits
    total = 0.0
    for x in values:
        total += float(x)
    shift = F32(total / n)
    centered = (values - shift).astype(F32)
    squares = 0.0
    for c in centered:
        squares += float(c) * float(c)
    sigma = math.sqrt(squares / (n - 1)) if n > 1 else 0.0
    scale = F32(6.0 * sigma / bins)
    if not (scale > 0 and math.isfinite(scale)):
        scale = F32(1.0)
    codes = np.clip(np.rint(centered / scale + F32(bins // 2)), 0, bins - 1).astype(np.int64)
    book = np.zeros(bins, dtype=F32)
    for b in range(bins):
        members = [float(c) for c, q in zip(centered, codes) if q == b]
        if members:
            acc = 0.0
            for c in members:
                acc += c
            book[b] = F32(acc / len(members))
    return (book[codes] + shift).astype(F32)


def sparseloco_message(e, opt):
    """The positions one worker sends and the values it delivers (the quadratic is one tensor)."""
    idx = chunk_topk(e, opt["chunk"], k_per_chunk(1.0 - opt["sparsity"], opt["chunk"]))
    values = e[idx]
    if opt["quant_bits"] > 0:
        values = quantize(values, opt["quant_bits"])
    return idx, values


# ----------------------------------------------------------------------------- the outer loop
def fragment_bounds(n, fragments):
    """One tensor: the fragments split the elements, b_f = floor(f n / F)."""
    return [f * n // fragments for f in range(fragments)] + [n]


def synced(t, inner_steps, fragments):
    """Fragment f syncs at the steps t with t mod H = floor((f + 1) H / F) mod H."""
    offsets = [(f + 1) * inner_steps // fragments % inner_steps for f in range(fragments)]
    return offsets.index(t % inner_steps) if t % inner_steps in offsets else -1


def run_reference(config, fused=True):
    """Worker 0's parameters and theta_global after the run, and per step the mean ||Delta_i|| and
    ||theta_i - theta_bar||; `fused`: the gradient's rounding (NoisyQuadratic.gradient)."""
    o = config["optimizer"]
    workers, steps, n = config["workers"], config["steps"], config["model"]["size"]
    kind = o["type"]
    opt = {"lr": o["lr"], "min_lr": -1.0, "warmup_steps": 0, "betas": (0.9, 0.95), "eps": 1e-8,
           "weight_decay": 0.1, "inner": o.get("inner", "adams")}
    inner_steps = o["inner_steps"]
    fragments = o.get("streaming_fragments", 1) if kind == "diloco" else 1
    outer_lr = F32(o.get("outer_lr", 0.7 if kind == "diloco" else 0.9))
    mu = F32(o.get("outer_momentum", 0.9))
    overlap = o.get("overlap_outer", False)
    sparse = {"chunk": o.get("chunk", 4096), "sparsity": o.get("sparsity", 0.99), "quant_bits": o.get("quant_bits", 2)}
    beta = F32(o.get("ef_decay", 0.999))
    problem = NoisyQuadratic(n, config["seed"], config["model"]["noise"])
    theta = [np.zeros(n, dtype=F32) for _ in range(workers)]
    m = [np.zeros(n, dtype=F32) for _ in range(workers)]
    v = [np.zeros(n, dtype=F32) for _ in range(workers)]
    error = [np.zeros(n, dtype=F32) for _ in range(workers)]
    snapshot = [np.zeros(n, dtype=F32) for _ in range(workers)]
    glob = np.zeros(n, dtype=F32)
    momentum = np.zeros(n, dtype=F32)
    bounds = fragment_bounds(n, fragments)
    pseudo_norms, drifts = [], []
    for t in range(1, steps + 1):
        for i in range(workers):
            inner_step(theta[i], m[i], v[i], problem.gradient(theta[i], t, i, fused), opt, t, steps)
        late = synced(t - 1, inner_steps, fragments) if (overlap and t > 1) else -1
        if late >= 0:
            lo, hi = bounds[late], bounds[late + 1]
            for i in range(workers):
                theta[i][lo:hi] = glob[lo:hi] + (theta[i][lo:hi] - snapshot[i][lo:hi])
        f = synced(t, inner_steps, fragments)
        if f < 0:
            pseudo_norms.append(math.nan)
            drifts.append(math.nan)
            continue
        lo, hi = bounds[f], bounds[f + 1]
        deltas = [glob[lo:hi] - theta[i][lo:hi] for i in range(workers)]
        pseudo_norms.append(sum(float(np.linalg.norm(d.astype(np.float64))) for d in deltas) / workers)
        if kind == "diloco":
            mean = all_reduce(deltas, o.get("outer_wire", "fp32"))
            drifts.append(sum(float(np.linalg.norm((mean - d).astype(np.float64))) for d in deltas) / workers)
            momentum[lo:hi] = momentum[lo:hi] * mu + mean
            step = momentum[lo:hi] * mu + mean
            glob[lo:hi] = glob[lo:hi] + step * (-outer_lr)
        else:
            drifts.append(math.nan)
            mean = np.zeros(n, dtype=F32)
            for i in range(workers):
                error[i] = error[i] * beta + deltas[i]
                idx, values = sparseloco_message(error[i], sparse)
                error[i][idx] = error[i][idx] + (-values)
                mean[idx] = mean[idx] + values
            mean = mean / F32(workers)
            glob = glob + mean * (-outer_lr)
        for i in range(workers):
            if overlap and t < steps:
                snapshot[i][lo:hi] = theta[i][lo:hi]
            else:
                theta[i][lo:hi] = glob[lo:hi]
    return theta[0], glob, np.array(pseudo_norms), np.array(drifts)
