"""The console's settings and its `:commands` (console.py runs them; nothing here generates).

Every command is one line starting with ':'; a bad one raises CommandError with a one-line
message and changes nothing. `:help` lists the commands with the current value of every setting.
"""
import math
from dataclasses import dataclass, field

from .policies import POLICIES, make_policy
from .sampling import check_sampling_options

GENERATORS = {  # name -> what it runs, in the order a prompt runs them
    "target": "target-only: plain decoding with the target and its KV cache",
    "nocache": "target-only WITHOUT the KV cache: the whole context recomputed for every token",
    "draft": "draft-only: what the draft model alone would write (not with the ngram drafter)",
    "speculative": "speculative decoding: the drafter proposes, the target verifies",
}


class CommandError(ValueError):
    """A console command that cannot be carried out: one line, the settings unchanged."""


@dataclass
class Settings:
    K: object = 4                    # int >= 1, "heuristic" or "auto"
    K_max: int = 8
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    n_tokens: int = 60
    drafter: str = "shakespeare-260K"
    generators: set = field(default_factory=lambda: {"speculative"})
    trace: bool = False

    def sampling(self):
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)

    def sampling_name(self):
        """greedy / sampling / top-k / nucleus, with the parameters in force."""
        if self.temperature == 0:
            return "greedy (temperature 0)"
        parts = [f"temperature {self.temperature:g}"]
        parts += [f"top_k {self.top_k}"] if self.top_k else []
        parts += [f"top_p {self.top_p:g}"] if self.top_p else []
        kind = "nucleus" if self.top_p else "top-k" if self.top_k else "sampling"
        return f"{kind} ({', '.join(parts)})"


HELP = """commands (a line without ':' is a prompt; every setting is kept until changed):
  :K N | heuristic | auto     drafts per round, or a K policy                     now {K}
  :K_max N                    the largest K heuristic / auto may use              now {K_max}
  :sampling greedy | sample T | top_k K [T] | nucleus P [T]
                              the sampling processor in one command               now {sampling}
  :temperature T  :top_k K|none  :top_p P|none    one sampling option at a time
  :seed N                     seed of each generator's np.random.Generator         now {seed}
  :n N                        tokens to generate                                   now {n_tokens}
  :drafter ngram | MODEL      switch the drafter (a model name or folder, or prompt lookup)  now {drafter}
  :on NAME... / :off NAME...  generators run per prompt: {names}  now {generators}
  :compare                    target-only and speculative, timed side by side
  :cache on | off             off: also run target-only without the KV cache      now {cache}
  :trace on | off             per round: drafts, p(x), q(x), min(1, p/q), accept or reject  now {trace}
  :clear                      clear the screen
  :help                       this list
  :quit                       leave (also Ctrl-D; Ctrl-C stops a generation, or leaves at the prompt)"""


def help_text(s):
    on = [g for g in GENERATORS if g in s.generators]
    return HELP.format(K=s.K, K_max=s.K_max, sampling=s.sampling_name(), seed=s.seed, n_tokens=s.n_tokens,
                       drafter=s.drafter, names=", ".join(GENERATORS), generators=", ".join(on) or "none",
                       cache="off" if "nocache" in s.generators else "on", trace="on" if s.trace else "off")


def number(text, kind, what):
    """int or float from text, or a one-line CommandError naming the setting."""
    try:
        value = kind(text)
    except ValueError:
        raise CommandError(f"{what} must be {'an integer' if kind is int else 'a number'}, got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise CommandError(f"{what} must be finite, got {text!r}")
    return value


def optional(text, kind, what):
    return None if text.lower() == "none" else number(text, kind, what)


def checked_sampling(s, **change):
    """The sampling options with `change` applied, checked by the package's own check."""
    options = {**s.sampling(), **change}
    try:
        check_sampling_options(**options)
    except ValueError as e:
        raise CommandError(str(e)) from None
    return options


def set_sampling(s, args):
    """:sampling greedy | sample T | top_k K [T] | nucleus P [T]."""
    if not args:
        raise CommandError(":sampling needs greedy, sample T, top_k K [T] or nucleus P [T]")
    kind, rest = args[0].lower(), args[1:]
    t = number(rest[-1], float, "temperature") if rest and kind != "sample" and len(rest) == 2 else 1.0
    if kind == "greedy" and not rest:
        change = dict(temperature=0.0, top_k=None, top_p=None)
    elif kind == "sample" and len(rest) <= 1:
        change = dict(temperature=number(rest[0], float, "temperature") if rest else 1.0, top_k=None, top_p=None)
    elif kind == "top_k" and 1 <= len(rest) <= 2:
        change = dict(temperature=t, top_k=number(rest[0], int, "top_k"), top_p=None)
    elif kind == "nucleus" and 1 <= len(rest) <= 2:
        change = dict(temperature=t, top_k=None, top_p=number(rest[0], float, "top_p"))
    else:
        raise CommandError(f":sampling {' '.join(args)}: use greedy, sample T, top_k K [T] or nucleus P [T]")
    if kind != "greedy" and change["temperature"] == 0:
        raise CommandError("temperature 0 is greedy: use :sampling greedy")
    return checked_sampling(s, **change)


def set_K(s, args):
    value = args[0] if args and args[0] in POLICIES[1:] else number(args[0], int, "K") if args else None
    try:
        make_policy(value, s.K_max)
    except ValueError as e:
        raise CommandError(str(e)) from None
    return value


def toggle(s, args, on):
    unknown = [a for a in args if a not in GENERATORS]
    if not args or unknown:
        raise CommandError(f"choose generators from {', '.join(GENERATORS)}" + (f", not {unknown[0]!r}" if unknown else ""))
    return s.generators | set(args) if on else s.generators - set(args)


def on_off(args, what):
    if len(args) != 1 or args[0] not in ("on", "off"):
        raise CommandError(f":{what} on | off")
    return args[0] == "on"


def apply(s, name, args):
    """Carry out one settings command on s; returns a one-line confirmation. Raises CommandError."""
    one = args[0] if len(args) == 1 else None
    if name in ("temperature", "top_k", "top_p", "seed", "n", "K_max") and one is None:
        raise CommandError(f":{name} takes one value")
    if name == "K":
        s.K = set_K(s, args[:1] if len(args) == 1 else [])
    elif name == "K_max":
        if number(one, int, "K_max") < 1:
            raise CommandError(f"K_max must be at least 1, got {one}")
        s.K_max = int(one)
    elif name == "sampling":
        s.temperature, s.top_k, s.top_p = set_sampling(s, args).values()
    elif name in ("temperature", "top_k", "top_p"):
        kind = int if name == "top_k" else float
        value = number(one, kind, name) if name == "temperature" else optional(one, kind, name)
        s.temperature, s.top_k, s.top_p = checked_sampling(s, **{name: value}).values()
    elif name == "seed":
        if number(one, int, "seed") < 0:
            raise CommandError(f"seed must be >= 0, got {one}")
        s.seed = int(one)
    elif name == "n":
        n = number(one, int, "n")
        if n < 1:
            raise CommandError(f"n must be at least 1, got {n}")
        s.n_tokens = n
    elif name in ("on", "off"):
        s.generators = toggle(s, args, name == "on")
    elif name == "compare":
        s.generators = s.generators | {"target", "speculative"}
    elif name == "cache":
        s.generators = s.generators - {"nocache"} if on_off(args, "cache") else s.generators | {"nocache"}
    elif name == "trace":
        s.trace = on_off(args, "trace")
    else:
        raise CommandError(f"unknown command :{name} (:help lists them)")
    return f"ok: K {s.K}, K_max {s.K_max}, {s.sampling_name()}, seed {s.seed}, n {s.n_tokens}, " \
           f"generators {', '.join(g for g in GENERATORS if g in s.generators) or 'none'}, trace {'on' if s.trace else 'off'}"
