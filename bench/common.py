"""Shared pieces of the benchmark: the plan, the stopwatch, byte and FLOP counts, tables, progress.

Every section takes a Plan (what to measure, at which sizes, how often) and returns plain dicts
that go into the JSON unchanged. Timings are medians over `repeats` runs after one warm-up run;
ratios are taken run by run (numerator and denominator timed back to back) and then the median,
because a shared 2-core host drifts by 30-50 % within minutes (measured on the machines this
project was built on: PERFORMANCE.md).
"""
import statistics
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field

import numpy as np

from gpt2np.model.config import PRESETS, GPT2Config

BYTES_PER_FLOAT = 4  # fp32 everywhere


# ---- what to measure ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    """Every knob of one benchmark run; `full_plan` and `tiny_plan` build the two presets."""
    sizes: tuple                    # model sizes measured one by one (keys of PRESETS or TINY_CONFIGS)
    repeats: int = 5                # timed runs per measurement, after one warm-up run
    prompt_len: int = 128           # the prompt of the reference comparison (baseline.py)
    prefill_lens: tuple = (128, 512, 1000)  # prefill is measured at each of these prompt lengths
    prefill_target_len: int = 512   # the prefill target (numpy / HF) is stated at this length
    contexts: tuple = (128, 512, 896)  # decode s/token is measured with this many tokens cached
    verify_contexts: tuple = (128, 896)  # the verification curve is measured after each of these contexts
    verify_context: int = 128       # the context of everything else that needs one (hf decode, targets)
    verify_max_m: int = 9           # M = 1..verify_max_m new tokens in one forward pass
    spec_prompt_len: int = 8        # short, so prefill is about one verification pass (see spec.py)
    spec_long_prompt: int = 896     # the forced-acceptance runs again after a prompt this long (0: not)
    spec_tokens: int = 30           # tokens per speculative / baseline run: a multiple of K + 1 (see spec.py)
    spec_repeats: int = 3           # speculative runs are long: fewer repeats than the rest
    K: int = 4                      # draft tokens per round
    alphas: tuple = (0.5, 0.8, 1.0)  # forced acceptance rates for the benchmark-only drafter
    pair: tuple = ("124M", "355M")  # (draft, target) shapes for the forced-acceptance runs
    policy_alphas: tuple = (0.3, 0.6, 0.8, 1.0)  # forced alphas of the K-policy sweep (policies.py)
    policy_K_max: int = 8           # the bound of heuristic / auto, and fixed K = 1..policy_K_max unless policy_Ks
    policy_Ks: tuple = ()           # the fixed Ks of the sweep (empty: 1..policy_K_max)
    policy_drafters: tuple = ("model", "lookup")  # the sweep's drafters (policies.py)
    policy_tokens: int = 100        # tokens per run of the sweep: at 40 (~15 rounds) auto's first, learning
                                    # rounds are a large share of every run (PERFORMANCE.md, K policies)
    policy_repeats: int = 1         # coin seeds of the sweep (repeat r: seed r); 20 runs per alpha (~10 min at 355M)
    policy_runs: int = 1            # runs per coin seed (each its own bracketed group): a seed's speedup is their median
    policy_lockstep: bool = False   # a group's runs and its plain baseline decode in lockstep (common.lockstep)
    policy_fresh_probe: bool = False  # every auto run reads the target's cost shape (as a fresh process), not once
    policy_read: bool = False       # one more side: auto reading the prompt before its first round
                                    # (policies.READ_PROMPT set for it)
    policy_prompt_len: int = 0      # the sweep's prompt (0: spec_prompt_len, 8: 7 positions for a read; a chat
                                    # turn's 17 and more give the read its PROMPT_POSITIONS = 16)
    reference_size: str = "124M"    # the slow reference path is compared at this size
    reference_new: int = 64         # new tokens after a prompt_len prompt
    reference_tokens: int = 8       # of which the reference actually generates this many (extrapolated)
    memory_sizes: tuple = ("124M", "355M")  # loaded together in a subprocess for peak RSS
    kernel_sizes: tuple = ("355M",)  # shapes of the kernels section: a worker process per OpenBLAS kernel each
    kernel_max_m: int = 16          # its verification curve: M = 1..kernel_max_m at verify_context
    kernel_rounds: int = 1          # its workers run kernel after kernel this many times over (~40 s each at 355M)
    bandwidth_mib: int = 1024       # streaming buffer; the host reports a 480 MiB L3, so stay well above
    small_m_shape: tuple = (1024, 4096)  # [in, out] of the product-level small-M curve (355M's c_fc)
    overhead_layers: tuple = (2, 12, 24)  # n_layer of the near-zero-FLOP models timed for Python overhead
    tiny: bool = False
    named: tuple = ()               # sizes that are model names (folder, hf:owner/name): real weights loaded
    configs: dict = field(default_factory=lambda: dict(PRESETS), compare=False)

    def __post_init__(self):
        if self.spec_prompt_len < 3:  # spec.py tells prefill calls apart by their length
            raise ValueError(f"spec_prompt_len must be >= 3, got {self.spec_prompt_len}")
        if self.policy_prompt_len != 0 and self.policy_prompt_len < 3:
            raise ValueError(f"policy_prompt_len must be 0 (spec_prompt_len) or >= 3, got {self.policy_prompt_len}")
        if 0 < self.spec_long_prompt < 3:
            raise ValueError(f"spec_long_prompt must be 0 or >= 3, got {self.spec_long_prompt}")

    def config(self, size) -> GPT2Config:
        return self.configs[size]

    def as_dict(self):
        d = asdict(self)
        d["configs"] = {k: asdict(v) for k, v in self.configs.items() if k in self.used_sizes()}
        return d

    def used_sizes(self):
        return (set(self.sizes) | set(self.pair) | {self.reference_size} | set(self.memory_sizes)
                | set(self.kernel_sizes))


TINY_CONFIGS = {
    # Two tiny shapes so that the pair, the memory section and the table layout are all exercised.
    "tiny": PRESETS["tiny"],
    "tiny2": GPT2Config(n_vocab=64, n_ctx=32, n_embd=32, n_head=2, n_layer=3),
}


def full_plan(sizes, repeats, **overrides):
    kw = dict(sizes=tuple(sizes), repeats=repeats, spec_repeats=min(repeats, 3))
    kw.update(overrides)
    return Plan(**kw)


def tiny_plan(repeats=2, **overrides):
    """Seconds-long run on two tiny configs: for the test suite, never for numbers."""
    # n_ctx is 32 in both tiny configs: contexts + 1, verify contexts + 9, verify_context + kernel_max_m,
    # spec prompts + 12 all fit
    kw = dict(sizes=("tiny", "tiny2"), repeats=repeats, prompt_len=8, prefill_lens=(8, 16, 28), prefill_target_len=16,
              contexts=(8, 16, 22), verify_contexts=(8, 22), verify_context=8, verify_max_m=9, spec_prompt_len=4,
              spec_long_prompt=16, spec_tokens=12, spec_repeats=repeats, K=3, alphas=(0.5, 1.0),
              pair=("tiny", "tiny2"), policy_alphas=(0.5, 1.0), policy_K_max=3, policy_tokens=12,
              policy_drafters=("model", "lookup", "self"),
              policy_repeats=1, reference_size="tiny2", reference_new=12, reference_tokens=4,
              memory_sizes=("tiny", "tiny2"), kernel_sizes=("tiny2",), kernel_max_m=16, kernel_rounds=2,
              bandwidth_mib=8, small_m_shape=(64, 256),
              overhead_layers=(1, 3), tiny=True, configs=dict(TINY_CONFIGS))
    kw.update(overrides)
    return Plan(**kw)


# ---- counting bytes and FLOPs --------------------------------------------------------------------

def weight_bytes_per_token(config):
    """fp32 weight bytes one decode step must read: 4·(L·(12d² + 13d) + V·d + 2d).

    Per block: c_attn 3d² + 3d, attn c_proj d² + d, c_fc 4d² + 4d, mlp c_proj 4d² + d, two layer
    norms 4d. The tied output head reads all of wte (V·d) once; ln_f is 2d. The embedding rows
    gathered for the input token (2d) are left out: two rows, negligible beside the rest.
    """
    d, L, V = config.n_embd, config.n_layer, config.n_vocab
    return BYTES_PER_FLOAT * (L * (12 * d * d + 13 * d) + V * d + 2 * d)


def kv_bytes(config, n_kv):
    """Bytes of cached keys and values one decode step reads when attending to n_kv positions."""
    return BYTES_PER_FLOAT * 2 * config.n_layer * n_kv * config.n_embd


def weight_bytes(config):
    """fp32 bytes of all parameters, as stored (the tied head counted once)."""
    return BYTES_PER_FLOAT * config.n_params()


def forward_flops(config, n_seq, n_past=0, n_logits=1):
    """Multiply-adds x 2 of one forward pass: the weight products, attention, and the output head."""
    d, L, V = config.n_embd, config.n_layer, config.n_vocab
    weights = 2 * n_seq * L * 12 * d * d
    n_kv_sum = sum(n_past + i + 1 for i in range(n_seq))  # keys each query attends to
    attention = 2 * 2 * L * d * n_kv_sum                   # q k^T and (softmax) v
    return weights + attention + 2 * n_logits * V * d


# ---- timing -------------------------------------------------------------------------------------

def seconds(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def summary(times):
    """Median (the number we report), min and max of a list of seconds."""
    return {"median": statistics.median(times), "min": min(times), "max": max(times), "n": len(times)}


def time_repeated(fn, repeats, warmup=1):
    """Run fn `warmup` times untimed, then `repeats` times timed; returns summary(times)."""
    for _ in range(warmup):
        fn()
    return summary([seconds(fn) for _ in range(repeats)])


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


# ---- runs side by side ---------------------------------------------------------------------------

class StreamSide:
    """One run advanced a round at a time (lockstep below): its Stream, the K of every round so far and how
    many tokens it has emitted; record(...) is what its section makes of it once it has ended (a closure
    over the stream), proxy the model wrapper that timed its calls, if any."""

    def __init__(self, stream, record, proxy=None):
        self.stream, self.record, self.proxy, self.ks, self.emitted = stream, record, proxy, [], 0

    def step(self):  # -> False once the stream has ended (that last call runs the run's calibration, if any)
        event = next(self.stream, None)
        if event is None:
            return False
        self.ks.append(event.K)
        self.emitted = event.n_emitted
        return True


def lockstep(sides, clock=time.perf_counter):
    """Run several Sides to their end together, one round at a time: always the side furthest behind in
    tokens emitted (ties: the list's order), each round timed on `clock`. Returns [seconds per side].

    A side is anything with step() (one round; False once it has ended, that call timed too) and
    emitted (tokens so far). Every side then decodes each stretch of the output within seconds of the
    others, so a shared machine's drift (10-40 % within a minute at 1558M) slows them all alike, where
    runs back to back give it to whichever ran in the slow minute. Used by the policies and batching
    sections (--policy-lockstep, --batch-lockstep: python -m bench's default); for models larger than the
    CPU's caches, which interleaved runs would otherwise evict from each other.

    >>> class Fake:  # emits `per_round` tokens a round, 6 in all; a round costs `cost` at today's speed
    ...     def __init__(self, per_round, cost):
    ...         self.per_round, self.cost, self.emitted = per_round, cost, 0
    ...     def step(self):
    ...         if self.emitted >= 6:
    ...             return False
    ...         now[0] += self.cost * speed[0]
    ...         speed[0] *= 1.05                                 # the machine slows by 5 % a round
    ...         self.emitted += self.per_round
    ...         return True
    >>> clock = lambda: now[0]
    >>> now, speed = [0.0], [1.0]                            # plain: 6 rounds of 1; drafting: 2 of 2; truly 1.5x
    >>> plain, drafting = lockstep([Fake(1, 1.0), Fake(3, 2.0)], clock)
    >>> round(plain / drafting, 2)                           # in lockstep
    1.55
    >>> now, speed = [0.0], [1.0]
    >>> [plain], [drafting] = lockstep([Fake(1, 1.0)], clock), lockstep([Fake(3, 2.0)], clock)
    >>> round(plain / drafting, 2)                           # back to back: drafting gets the slow minutes
    1.24
    """
    seconds, live = [0.0] * len(sides), list(range(len(sides)))
    while live:
        i = min(live, key=lambda j: sides[j].emitted)  # the first of the furthest behind
        start = clock()
        going = sides[i].step()
        seconds[i] += clock() - start
        if not going:
            live.remove(i)
    return seconds


# ---- progress and tables ------------------------------------------------------------------------

_T0 = time.perf_counter()


def log(message):
    """A progress line with the seconds since the run started (stderr keeps stdout for tables)."""
    print(f"[{time.perf_counter() - _T0:7.1f}s] {message}", file=sys.stderr, flush=True)


def fmt(value, spec=".3g"):
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, (float, np.floating)):
        return format(float(value), spec)
    return str(value)


def ms(s):
    return None if s is None else 1e3 * s


def print_table(title, headers, rows, note=None):
    """A plain-text table on stdout: headers, then rows of already formatted cells (str or number)."""
    cells = [[fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = "  ".join("-" * w for w in widths)
    print(f"\n## {title}")
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths)))
    print(line)
    for r in cells:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    if note:
        print(note)
    sys.stdout.flush()


def blas_limits(threads):
    """threadpoolctl's limit of BLAS to `threads` threads, in force from this call (and a context
    manager that restores the old setting); nullcontext() for no limit; None if threadpoolctl is
    missing while a limit was asked for."""
    if not threads:
        return nullcontext()
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None
    return threadpool_limits(limits=threads, user_api="blas")


def random_ids(n, n_vocab, seed=1):
    """n token ids drawn uniformly: random weights make every id equally meaningless."""
    return np.random.default_rng(seed).integers(0, n_vocab, size=n).tolist()


def _proc_status_kib(field):
    try:
        with open("/proc/self/status") as f:
            line = next((line for line in f if line.startswith(field + ":")), None)
        return None if line is None else int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None


def rss_bytes():
    """Current resident set size of this process (Linux /proc), or None elsewhere."""
    return _proc_status_kib("VmRSS")


def peak_rss_bytes():
    """This process's RSS high-water mark (VmHWM). Unlike getrusage's ru_maxrss, it starts afresh
    at exec, so a subprocess does not inherit its parent's peak."""
    return _proc_status_kib("VmHWM")


def add_section(results, name, out):
    """A section run after the others (python -m bench's long ones): its results under results[name],
    its seconds into meta (section_seconds, wall_seconds)."""
    results[name] = out
    meta = results["meta"]
    meta.setdefault("section_seconds", {})[name] = out["seconds"]
    meta["wall_seconds"] = meta.get("wall_seconds", 0) + out["seconds"]


def numbers(text, kind, flag):  # "1,2,4" -> (1, 2, 4): a flag's comma-separated values, or a one-line SystemExit
    try:
        values = tuple(kind(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SystemExit(f"{flag}: comma-separated {kind.__name__}s, got {text!r}") from None
    if not values:
        raise SystemExit(f"{flag}: at least one value, got {text!r}")
    return values
