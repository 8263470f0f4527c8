"""An independent numpy reference of SCAPE, written from docs/algorithms.md alone.

This module re-implements SCAPE's three formulations (`paper`, `artifact`, `frozen_momentum`) from
the specification (the "Notation", "Dense references" and "SCAPE" sections of the algorithms page,
kept in this checkout as shared/design/ALGORITHMS.md) and from the details pinned in this folder's
README.md, without reading the C++ core, so that a test comparing the two can catch a misreading
in either. W workers run in one process on a recorded gradient trace; every worker's replica of
the parameters is the same, so one copy is kept. Arithmetic is fp32 element by element with
scalars rounded to fp32 once from double. Where the specification leaves a choice open, the
reading taken is stated in a comment beginning "Reading:", next to the code that depends on it.
"""

import math

import numpy as np

F32 = np.float32
E5M2_MAX = 57344.0

DEFAULTS = {
    "lr": 6e-4, "min_lr": -1.0, "warmup_steps": 0, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
    "weight_decay": 0.1, "bias_correction": True, "sparsity": 0.99, "sharded": True,
    "formulation": "paper", "mask_scope": "tensor", "dense_tensors": ["norm", "bias"],
    "adams_form": None, "clip_grad": 0.0, "mask_lag": 1, "density_warmup": 0,
    "density_start": 1.0, "density_cooldown": 0, "density_cooldown_start": 0,
    "residual": True, "wire_dtype": "fp32",
}
# Switches the reference implements at their default value only.
FIXED = {
    "inner": "adams", "update": "masked", "mask_statistic": "first_moment",
    "mask_partition": "partitioned", "second_moment": "single_buffer",
    "residual_decay": 1.0, "residual_clip": 0.0,
}
CHOICES = {
    "formulation": ("paper", "artifact", "frozen_momentum"), "mask_scope": ("tensor", "shard"),
    "adams_form": ("artifact", "momentum_corrected"), "mask_lag": (0, 1),
    "wire_dtype": ("fp32", "fp8_e5m2"),
}


# ----------------------------------------------------------------------------- options
def resolve_options(optimizer):
    """The optimizer dict with defaults filled in; ValueError for unknown keys or values."""
    opt = dict(DEFAULTS)
    for key, value in dict(optimizer).items():
        if key in FIXED:
            fixed = FIXED[key]
            same = (float(value) == fixed) if isinstance(fixed, float) else (value == fixed)
            if not same:
                raise ValueError(f"optimizer.{key} = {value!r}: the reference implements only {fixed!r}")
        elif key == "type":
            if value != "scape":
                raise ValueError(f"optimizer.type = {value!r}: the reference is SCAPE only")
        elif key == "param_dtype":
            if value != "fp32":
                raise ValueError(f"optimizer.param_dtype = {value!r}: only fp32")
        elif key == "betas":
            opt["beta1"], opt["beta2"] = float(value[0]), float(value[1])
        elif key in DEFAULTS:
            opt[key] = value
        else:
            raise ValueError(f"unknown optimizer key {key!r}")
    if opt["adams_form"] is None:
        opt["adams_form"] = "momentum_corrected" if opt["formulation"] == "frozen_momentum" else "artifact"
    if "dense_tensors" not in optimizer and opt["mask_scope"] == "shard":
        opt["dense_tensors"] = []  # the documented default under mask_scope = shard
    for key, allowed in CHOICES.items():
        if opt[key] not in allowed:
            raise ValueError(f"optimizer.{key} = {opt[key]!r}: expected one of {allowed}")
    for key in ("sharded", "residual", "bias_correction"):
        if not isinstance(opt[key], (bool, np.bool_)):
            raise ValueError(f"optimizer.{key} must be a bool")
    if not 0.0 <= float(opt["sparsity"]) < 1.0:
        raise ValueError("optimizer.sparsity must lie in [0, 1)")
    if not 0.0 < float(opt["density_start"]) <= 1.0:
        raise ValueError("optimizer.density_start must lie in (0, 1]")
    if float(opt["clip_grad"]) < 0.0:
        raise ValueError("optimizer.clip_grad must be >= 0")
    for key in ("warmup_steps", "density_warmup", "density_cooldown"):
        if int(opt[key]) < 0:
            raise ValueError(f"optimizer.{key} must be >= 0")
    if isinstance(opt["dense_tensors"], str) or not all(isinstance(s, str) for s in opt["dense_tensors"]):
        raise ValueError("optimizer.dense_tensors must be a list of strings")
    return opt


def _with_defaults(opt):
    return {**DEFAULTS, **dict(opt)}


# ----------------------------------------------------------------------------- schedules
def learning_rate(t, opt, total_steps):
    """eta_t in double: linear warm-up to lr over warmup_steps, then cosine to min_lr."""
    o = _with_defaults(opt)
    lr, u = float(o["lr"]), int(o["warmup_steps"])
    low = lr / 10.0 if float(o["min_lr"]) < 0.0 else float(o["min_lr"])
    if u > 0 and t <= u:
        return lr * t / u
    return low + 0.5 * (lr - low) * (1.0 + math.cos(math.pi * (t - u) / max(1, total_steps - u)))


def density_at(t, opt):
    """rho_t of step t (1-based), in double.

    Warm-up: rho_t = s * (rho/s)^(tau/T_w) for tau = t-1 < T_w, then rho.
    Cool-down (the page says only "geometric back to 1, as the artifact's"; the artifact's
    _scheduled_density decides it): with T_c = density_cooldown > 0 the warm-up is not used at
    all; before c0 = density_cooldown_start the density is rho, from c0 on
    rho * (1/rho)^min(1, (tau-c0)/T_c).
    """
    o = _with_defaults(opt)
    rho = 1.0 - float(o["sparsity"])
    tau = t - 1
    tw, start = int(o["density_warmup"]), float(o["density_start"])
    value = start * (rho / start) ** (tau / tw) if (tw > 0 and tau < tw) else rho
    tc = int(o["density_cooldown"])
    if tc > 0:
        c0 = max(0, int(o["density_cooldown_start"]))
        value = rho
        if tau >= c0:
            done = tau - c0
            value = 1.0 if (rho >= 1.0 or done >= tc) else rho * (1.0 / rho) ** (done / tc)
    return min(value, 1.0)


def _k_rule(rho, n, integer_part):
    if n <= 0:
        return 0
    if rho >= 1.0:
        return n
    x = rho * n
    nearest = math.floor(x + 0.5)
    k = nearest if abs(x - nearest) <= 1e-9 * max(1.0, x) else integer_part(x)
    return max(1, min(n, int(k)))


def k_tensor(rho, n):
    """k of a tensor or fragment of n elements: floor(rho*n), snapped within 1e-9, in [1, n]."""
    return _k_rule(rho, n, math.floor)


def k_shard(rho, n):
    """k of a whole shard's n non-dense elements (mask_scope = shard): as k_tensor with ceil."""
    return _k_rule(rho, n, math.ceil)


# ----------------------------------------------------------------------------- ownership
def shard_ranges(N, W):
    """[(begin, end)] of shard S_w = [w*s, min((w+1)*s, N)), s = 64*ceil(N/(64 W))."""
    s = 64 * (-(-N // (64 * W)))
    return [(min(w * s, N), min((w + 1) * s, N)) for w in range(W)]


def tensor_owners(layout, W):
    """Owner of each tensor in replicated mode (mask_scope = tensor).

    The page's "balanced by element count ... while enough tensors remain for the later owners"
    leaves the exact rule open; the authors' artifact decides it (mz687/SCAPE_SC26,
    megatron/core/distributed/fp8_topk_adams_reducer.py, commit 1a39ade, the reducer's
    constructor), and this is its rule, stated here from docs/algorithms.md: tensors are dealt in
    layout order from owner w = 0, each owner counting only its own elements C_w. After tensor j
    (0-based, of T) goes to w, w advances (and its count restarts) iff w < W-1, at least one tensor
    remains, and either C_w * W >= N or the remaining tensors T-j-1 are no more than the later
    owners W-1-w (so that each of them gets one).
    """
    sizes = [int(entry["size"]) for entry in layout]
    total, count = sum(sizes), len(sizes)
    owners, w, running = [], 0, 0
    for j, n in enumerate(sizes):
        owners.append(w)
        running += n
        later, remaining = W - 1 - w, count - j - 1
        if later > 0 and remaining > 0 and (running * W >= total or remaining <= later):
            w += 1
            running = 0
    return owners


def _tensor_ranges(layout):
    ranges, begin = [], 0
    for entry in layout:
        ranges.append((begin, begin + int(entry["size"])))
        begin += int(entry["size"])
    return ranges


def selection_units(layout, W, opt):
    """(dense positions, [(owner, positions, k function)]): where the mask takes its top-k."""
    ranges = _tensor_ranges(layout)
    N = ranges[-1][1] if ranges else 0
    dense = np.zeros(N, dtype=bool)
    is_dense = [any(sub in entry["name"] for sub in opt["dense_tensors"]) for entry in layout]
    for (a, b), flag in zip(ranges, is_dense):
        dense[a:b] = flag
    units = []
    if opt["mask_scope"] == "shard":  # k_w per whole shard, in either mode
        for w, (a, b) in enumerate(shard_ranges(N, W)):
            idx = np.arange(a, b)[~dense[a:b]]
            if idx.size:
                units.append((w, idx, k_shard))
    elif opt["sharded"]:  # each tensor fragment inside a shard, selected by that shard's owner
        for (a, b), flag in zip(ranges, is_dense):
            for w, (sa, sb) in enumerate(shard_ranges(N, W)):
                lo, hi = max(a, sa), min(b, sb)
                if not flag and lo < hi:
                    units.append((w, np.arange(lo, hi), k_tensor))
    else:  # whole tensors, dealt by tensor_owners
        for (a, b), flag, w in zip(ranges, is_dense, tensor_owners(layout, W)):
            if not flag and a < b:
                units.append((w, np.arange(a, b), k_tensor))
    return dense, units


# ----------------------------------------------------------------------------- mask
def topk_mask(values, k):
    """Bool mask of the k entries of largest |value|; equal magnitudes go to the lower index.

    (NaN, which the page does not rank, is put above +inf.)
    """
    values = np.asarray(values, dtype=np.float64)
    mag = np.abs(values)
    nan = np.isnan(mag)
    order = np.lexsort((np.arange(values.size), -np.where(nan, 0.0, mag), ~nan))
    out = np.zeros(values.size, dtype=bool)
    out[order[:k]] = True
    return out


def select_mask(statistic, rho, dense, units):
    """Partitioned mask: every dense bit, and per unit the top-k of its owner's |statistic|."""
    mask = dense.copy()
    for owner, idx, kfun in units:
        chosen = topk_mask(statistic[owner, idx], kfun(rho, idx.size))
        mask[idx[chosen]] = True
    return mask


# ----------------------------------------------------------------------------- wire
def e5m2_round(x):
    """Round to e5m2 (bias 15, 2 mantissa bits, subnormals to 2^-16), nearest even; float64 out.

    Reading: "a value past the largest finite one (57344) is an error" is taken literally: any
    |x| > 57344 (and any non-finite x) raises ValueError, even one that would round down to 57344.
    """
    x = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(x)) or np.any(np.abs(x) > E5M2_MAX):
        raise ValueError("e5m2: value past the largest finite e5m2 value (57344)")
    mag = np.abs(x)
    _, exponent = np.frexp(mag)  # mag = f * 2^exponent, f in [0.5, 1)
    quantum = np.ldexp(1.0, np.maximum(exponent - 1, -14) - 2)
    return np.copysign(np.rint(mag / quantum) * quantum, x)


def _floor_log2(x):
    return int(np.frexp(np.float64(x))[1]) - 1


def _rank_sum(x):
    """fp32 sum over axis 0 in rank order ((x_0 + x_1) + x_2) + ..."""
    acc = x[0].copy()
    for row in x[1:]:
        acc = acc + row
    return acc


def fp8_payload(values, t, wire):
    """e5m2 exchange of payload values [W, K]: (delivered per worker q*2^s [W, K], reduced [K]).

    wire["s"] holds the shared exponent; it is taken at step 1, at every t with (t-1) % 100 == 0,
    and whenever the values would overflow with the current one.
    """
    W = values.shape[0]
    scaled = values / F32(W)
    refresh = wire["s"] is None or (t - 1) % 100 == 0
    if not refresh:
        refresh = bool(np.any(np.abs(scaled * F32(2.0 ** -wire["s"])) > E5M2_MAX))
    if refresh:
        peak = float(np.max(np.abs(values))) if values.size else 0.0
        wire["s"] = _floor_log2(peak) if peak > 0.0 else 0
    s = wire["s"]
    q = e5m2_round(scaled * F32(2.0 ** -s)).astype(F32)
    return q * F32(2.0 ** s), _rank_sum(q) * F32(2.0 ** s)


# ----------------------------------------------------------------------------- one step
def _scalars(opt, t, total_steps):
    b1, b2 = float(opt["beta1"]), float(opt["beta2"])
    c1 = 1.0 - b1 ** t if opt["bias_correction"] else 1.0
    c2 = 1.0 - b2 ** t if opt["bias_correction"] else 1.0
    eta = learning_rate(t, opt, total_steps)
    return {
        "b1": F32(b1), "omb1": F32(1.0 - b1), "b2": F32(b2), "omb2": F32(1.0 - b2),
        "eps": F32(opt["eps"]), "c1": F32(c1), "sqrt_c2": F32(math.sqrt(c2)), "eta": F32(eta),
        # Reading: the decay factor is one scalar, 1 - eta_t * lambda in double, rounded once.
        "decay": F32(1.0 - eta * float(opt["weight_decay"])),
    }


def _candidates(opt, sc, m, e, g):
    """Payload c_i [W, N] (its formula is also the next mask's statistic), and p_i = b1 m + (1-b1) g_i."""
    if opt["formulation"] == "frozen_momentum":
        a = e + g  # residual in gradient units
        return sc["b1"] * m + sc["omb1"] * a, None
    p = sc["b1"] * m + sc["omb1"] * g
    return p + e, p


def _exchange(opt, c, idx, shard_owner, t, wire):
    """b-bar on the mask positions idx, and each worker's undelivered part there [W, K]."""
    vals = c[:, idx]
    W = c.shape[0]
    owner_only = opt["formulation"] == "artifact" and opt["sharded"]
    if owner_only:  # each rank fills only its own shard before the average: owner's c / W
        rows = shard_owner[idx]
        own = vals[rows, np.arange(idx.size)]
        left = np.zeros_like(vals)
        if opt["wire_dtype"] == "fp32":
            return own / F32(W), left
        # Reading: under fp8 only the owner's value is sent (the others send zeros), so the
        # exponent's max runs over the owners' values; the owner keeps its rounding error.
        sent = np.zeros_like(vals)
        sent[rows, np.arange(idx.size)] = own
        delivered, _ = fp8_payload(sent, t, wire)
        mine = delivered[rows, np.arange(idx.size)]
        left[rows, np.arange(idx.size)] = own - F32(W) * mine
        return mine, left
    if opt["wire_dtype"] == "fp32":
        return _rank_sum(vals) / F32(W), np.zeros_like(vals)
    delivered, reduced = fp8_payload(vals, t, wire)
    return reduced, vals - F32(W) * delivered


def _new_residual(opt, sc, c, p, e, g, idx, left, shard_owner):
    if not opt["residual"]:
        return np.zeros_like(e)
    if opt["formulation"] == "frozen_momentum":
        new = e + g
        # Reading: an fp8 error (in b units) is kept in gradient units, divided by (1 - b1).
        new[:, idx] = left / sc["omb1"]
    elif opt["formulation"] == "artifact" and not opt["sharded"]:
        new = F32(2.0) * p + e  # step 4 run twice: (1-M)(2(b1 m + (1-b1) g_i) + e_i)
        new[:, idx] = left
    else:
        new = c.copy()
        new[:, idx] = left
    if opt["formulation"] == "artifact" and opt["sharded"]:
        # The artifact's sharded path forms c only on each rank's own shard (its reducer, commit
        # 1a39ade): other ranks' gradients there reach no residual.
        new[np.arange(new.shape[0])[:, None] != shard_owner[None, :]] = 0
    return new


def _moments(opt, sc, m, idx, b_bar):
    """(m_new, reconstructed gradient on idx, m_new on idx) after reconstruction and clipping."""
    m_prev = m[idx]
    g_hat = (b_bar - sc["b1"] * m_prev) / sc["omb1"]
    m_mask = b_bar
    clip = float(opt["clip_grad"])
    if clip > 0.0:
        nu = math.sqrt(float(np.sum(g_hat.astype(np.float64) ** 2)))
        coef = clip / (nu + 1e-6)
        if coef < 1.0:
            g_hat = g_hat * F32(coef)
            m_mask = sc["b1"] * m_prev + sc["omb1"] * g_hat
    # paper / artifact: m <- 0 off the mask; frozen_momentum: m frozen off the mask.
    m_new = m.copy() if opt["formulation"] == "frozen_momentum" else np.zeros_like(m)
    m_new[idx] = m_mask
    return m_new, g_hat, m_mask


def _inner_step(opt, sc, m_prev, m_mask, g_hat):
    """AdamS step u on the mask positions, in the form adams_form names."""
    if opt["adams_form"] == "artifact":
        v = sc["b2"] * (m_prev * m_prev) + sc["omb2"] * (g_hat * g_hat)
        return (m_mask / sc["c1"]) / (np.sqrt(v) / sc["sqrt_c2"] + sc["eps"])
    corrected = m_prev / sc["c1"]
    d = np.sqrt(sc["b2"] * (corrected * corrected) + sc["omb2"] * (g_hat * g_hat)) + sc["eps"]
    return (m_mask / sc["c1"]) / d


# ----------------------------------------------------------------------------- driver
def run_reference(optimizer, layout, theta0, grads, total_steps):
    """Run SCAPE on a gradient trace grads [T, W, N]; one dict per step (see README.md)."""
    opt = resolve_options(optimizer)
    grads = np.asarray(grads, dtype=F32)
    steps, W, N = grads.shape
    if N != sum(int(entry["size"]) for entry in layout):
        raise ValueError("grads' last axis must equal the layout's total size")
    if total_steps < steps:
        raise ValueError("total_steps must be at least the number of steps run")
    dense, units = selection_units(layout, W, opt)
    decay = np.zeros(N, dtype=bool)
    for (a, b), entry in zip(_tensor_ranges(layout), layout):
        decay[a:b] = bool(entry["decay"])
    shard_owner = np.zeros(N, dtype=np.int64)
    for w, (a, b) in enumerate(shard_ranges(N, W)):
        shard_owner[a:b] = w

    theta = np.array(theta0, dtype=F32).reshape(N).copy()
    m = np.zeros(N, dtype=F32)
    e = np.zeros((W, N), dtype=F32)
    wire = {"s": None}
    pending = None  # the lagged mask chosen at the previous step
    out = []
    for t in range(1, steps + 1):
        g = grads[t - 1]
        sc = _scalars(opt, t, total_steps)
        rho = density_at(t, opt)
        c, p = _candidates(opt, sc, m, e, g)
        # M_1 always, and every mask under lag 0, from this step's own statistic.
        mask = select_mask(c, rho, dense, units) if pending is None else pending
        idx = np.flatnonzero(mask)
        b_bar, left = _exchange(opt, c, idx, shard_owner, t, wire)
        e_new = _new_residual(opt, sc, c, p, e, g, idx, left, shard_owner)
        m_new, g_hat, m_mask = _moments(opt, sc, m, idx, b_bar)
        u = _inner_step(opt, sc, m[idx], m_mask, g_hat)
        theta = np.where(decay, theta * sc["decay"], theta)  # decay -> moments -> step
        theta[idx] = theta[idx] - sc["eta"] * u
        record = {
            "theta": theta.copy(), "m": m_new.copy(), "residual": e_new.copy(),
            "mask": mask.copy(), "k_total": int(mask.sum()), "density": rho,
            "lr": float(sc["eta"]),
        }
        if opt["wire_dtype"] == "fp8_e5m2":
            record["wire_exponent"] = wire["s"]
        pending = None
        if int(opt["mask_lag"]) == 1 and t < total_steps:
            # M_{t+1}: each owner's top-k of its own |c| of this step, at density rho_{t+1}.
            pending = select_mask(c, density_at(t + 1, opt), dense, units)
            record["next_mask"] = pending.copy()
        out.append(record)
        m, e = m_new, e_new
    return out
