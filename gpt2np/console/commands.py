"""The console's settings and commands: one typed line in, new settings (or a one-line error) out.

Pure: no models, no printing, no decoding. repl.py reads lines, display.py shows results;
runs.py is the one place that calls the decoders. A command is a line starting with ':'
(`:temperature 0.8`, `:K auto 12`, `:sampling nucleus 0.9 0.8`), or '/' (slash.py turns it into
the ':' line with its meaning); anything else is a prompt.

>>> outcome = parse_command(":sampling top_k 40 0.8", Settings())
>>> outcome.settings.temperature, outcome.settings.top_k, outcome.settings.top_p
(0.8, 40, None)
>>> parse_command(":temperature -1", Settings())
Traceback (most recent call last):
gpt2np.console.commands.CommandError: temperature must be a finite number >= 0 (0 means greedy), got -1.0
"""
import math
import os
import re
from dataclasses import dataclass, replace

from gpt2np import check_sampling_options, is_greedy, make_policy
from gpt2np import report
from gpt2np.report import check_typed_tree, tree_from_text

from .runs import TREE_NEEDS_CACHE

# the order generators run in: speculative last, so its speedup over target-only is known when it ends
GENERATORS = ("target", "draft", "speculative")
COMPARED = ("target", "speculative")  # what :compare runs
GENERATOR_LABELS = {"target": "target-only", "draft": "draft-only", "speculative": "speculative"}
SWITCH_WORDS = {"on": True, "off": False, "yes": True, "no": False, "true": True, "false": False,
                "1": True, "0": False}


class CommandError(ValueError):
    """A bad command or value: the console prints its one line and carries on."""


@dataclass(frozen=True)
class Settings:
    """Everything a prompt's runs depend on; every run draws from np.random.default_rng(seed)."""
    K: object = 4                 # drafts per round, or a K policy: "heuristic" / "auto"
    K_max: int = 8                # the bound of the heuristic and auto policies
    tree: object = None           # a token tree instead of a chain: widths per depth (3, 2, 1), "auto", or None
    temperature: float = 0.0      # 0: greedy (argmax)
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    n_tokens: int = 200
    drafter: str | None = None    # "ngram", a model name or folder; None: no drafter loaded
    speculative: bool = True      # which generators run on each prompt (GENERATORS)
    target: bool = False
    draft: bool = False
    compare: bool = False         # target-only and speculative on every prompt, whatever the two above say
    trace: bool = False           # print every speculative round: drafts, p, q, accept / reject
    cache: bool = True            # off: every run also runs again recomputing the whole context each step

    @property
    def sampling(self):
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)

    def enabled(self):
        """The generators that run on a prompt, in order: those switched on, and both compared ones."""
        return [g for g in GENERATORS if getattr(self, g) or (self.compare and g in COMPARED)]


@dataclass(frozen=True)
class Outcome:
    settings: Settings
    message: str | None = None    # what changed, for the user
    action: str | None = None     # "help" / "quit" / "clear" / "drafter" (the console does those)
    argument: str | None = None   # the drafter to load


# ---- values ---------------------------------------------------------------------------------------

def integer(text, name, minimum):
    try:
        value = int(text)
    except ValueError:
        raise CommandError(f"{name} must be an integer >= {minimum}, got {text!r}") from None
    if value < minimum:
        raise CommandError(f"{name} must be an integer >= {minimum}, got {value}")
    return value


def number(text, name):
    try:
        value = float(text)
    except ValueError:
        raise CommandError(f"{name} must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise CommandError(f"{name} must be a finite number, got {text!r}")
    return value


def switch(args, current, name):
    """on / off (yes / no, 1 / 0); no argument flips the current value."""
    if not args:
        return not current
    if len(args) > 1 or args[0].lower() not in SWITCH_WORDS:
        raise CommandError(f"{name} takes on or off (or nothing, to toggle), got {' '.join(args)!r}")
    return SWITCH_WORDS[args[0].lower()]


def exactly(args, n, usage):
    if len(args) != n:
        raise CommandError(f"usage: {usage}")
    return args


def checked(settings, spell=str):
    """settings, if the sampling options and K policy are valid; else the one-line CommandError,
    the setting named as the user typed it: spell("top_p") is "--top_p" for a flag, "top_p" here."""
    try:
        check_sampling_options(**settings.sampling)
        make_policy(settings.K, settings.K_max)
    except ValueError as e:
        raise CommandError(re.sub(r"^(temperature|top_k|top_p|K_max)\b", lambda m: spell(m[1]), str(e))) from None
    return settings


def K_value(text, flag):
    """K as typed after `flag` (--K on the command line, :K here): an integer >= 1, heuristic or auto.
    The one place K's error is worded, so that it names what the user typed."""
    if text in ("heuristic", "auto"):
        return text
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < 1:
        got = repr(text) if value is None else value
        raise CommandError(f"{flag} must be an integer >= 1, 'heuristic' or 'auto', got {got}")
    return value


def check_tree_drafter(tree, drafter, spell):
    """report.check_tree_drafter as a CommandError (every prompt would refuse it, in the API's words)."""
    try:
        report.check_tree_drafter(tree, drafter, spell)
    except ValueError as e:
        raise CommandError(str(e)) from None


# ---- the commands ---------------------------------------------------------------------------------

def set_K(s, args):
    """K drafts a chain: it turns a tree off (describe_change says "tree: off"), as --K and --tree
    are refused together on the command line; a tree set after it keeps K for when it is off."""
    if not 1 <= len(args) <= 2:
        raise CommandError("usage: :K N | heuristic [K_max] | auto [K_max]")
    s = replace(s, tree=None)
    if args[0].lower() in ("heuristic", "auto"):  # as :tree AUTO and :trace ON: any case
        K_max = integer(args[1], "K_max", 1) if len(args) == 2 else s.K_max
        return replace(s, K=args[0].lower(), K_max=K_max)
    if len(args) == 2:
        raise CommandError("K_max bounds :K heuristic or :K auto only (a fixed K is its own bound)")
    return replace(s, K=K_value(args[0], ":K"))


def tree_widths(text):
    """A tree as :tree and --tree take it: '3,2,1' -> (3, 2, 1), 'auto', or 'off' / 'none' -> None; a
    typed tree within report's caps (TREE_MAX_WIDTH children a node, TREE_MAX_NODES nodes), as main.py's."""
    if text.lower() in ("off", "none"):
        return None
    try:
        tree = tree_from_text(text.lower() if text.lower() == "auto" else text)
    except ValueError:
        raise CommandError(f"tree must be children per depth, comma-separated integers >= 1 (e.g. 3,2,1), "
                           f"auto or off, got {text!r}") from None
    try:
        return tree if tree == "auto" else check_typed_tree(tree, text)
    except ValueError as e:
        raise CommandError(str(e)) from None


def set_tree(s, args):
    tree = tree_widths(exactly(args, 1, ":tree W1,W2,...|auto|off")[0])
    check_tree_drafter(tree, s.drafter, lambda name: f":{name}")
    if tree is not None and not s.cache:  # refused now, not at every prompt
        raise CommandError(f":tree with :cache off: {TREE_NEEDS_CACHE}: :cache on first")
    return replace(s, tree=tree)


def set_cache(s, args):
    on = switch(args, s.cache, ":cache")
    if not on and s.tree is not None:
        raise CommandError(f":cache off with a tree: {TREE_NEEDS_CACHE}: :tree off first")
    return replace(s, cache=on)


def optional(args, name, parse):
    """top_k / top_p: a value, or off / none to keep every token."""
    value = exactly(args, 1, f":{name} VALUE|off")[0]
    return None if value.lower() in ("off", "none") else parse(value)


def set_sampling(s, args):
    """greedy | plain [T] | top_k K [T] | nucleus P [T]: the whole processor in one command."""
    usage = "usage: :sampling greedy | plain [T] | top_k K [T] | nucleus P [T]"
    mode, rest = (args[0].lower(), args[1:]) if args else ("", [])
    if mode == "greedy" and not rest:
        return replace(s, temperature=0.0, top_k=None, top_p=None)
    n_params = {"plain": 0, "top_k": 1, "nucleus": 1, "top_p": 1}.get(mode)
    if n_params is None or not n_params <= len(rest) <= n_params + 1:
        raise CommandError(usage)
    temperature = number(rest[n_params], "temperature") if len(rest) > n_params else 1.0
    if temperature <= 0:
        raise CommandError(f"{mode} sampling needs a temperature > 0, got {temperature} "
                           "(temperature 0 is :sampling greedy)")
    top_k = integer(rest[0], "top_k", 1) if mode == "top_k" else None
    top_p = number(rest[0], "top_p") if mode in ("nucleus", "top_p") else None
    return replace(s, temperature=temperature, top_k=top_k, top_p=top_p)


def set_generator(name):
    def command(s, args):
        on = switch(args, getattr(s, name), f":{name}")
        if on and name == "speculative" and s.drafter is None:
            raise CommandError("speculative decoding needs a drafter: :drafter ngram, or :drafter MODEL")
        if on and name == "draft" and s.drafter in (None, "ngram"):
            raise CommandError("draft-only is not available with the ngram drafter (prompt lookup is not a model "
                               "that can write alone): :drafter MODEL first" if s.drafter else
                               "draft-only needs a draft model: :drafter MODEL first")
        return replace(s, **{name: on})
    return command


def set_compare(s, args):
    """Compare mode: target-only beside speculative on every prompt. Its own setting: it changes
    neither :target nor :speculative, and they never turn it on or off."""
    on = switch(args, s.compare, ":compare")
    if on and s.drafter is None:
        raise CommandError("compare needs a drafter: :drafter ngram, or :drafter MODEL")
    return replace(s, compare=on)


def set_value(command, field, parse):
    """:command VALUE sets one field to parse(VALUE)."""
    def command_(s, args):
        return replace(s, **{field: parse(exactly(args, 1, f":{command} VALUE")[0])})
    return command_


def set_switch(field):
    """:field [on|off] turns a flag on or off, or flips it."""
    def command_(s, args):
        return replace(s, **{field: switch(args, getattr(s, field), f":{field}")})
    return command_


def set_top_k(s, args):
    return replace(s, top_k=optional(args, "top_k", lambda v: integer(v, "top_k", 1)))


def set_top_p(s, args):
    return replace(s, top_p=optional(args, "top_p", lambda v: number(v, "top_p")))


# name -> (usage, what it does, handler(settings, args) -> settings); ACTIONS are done by the console
COMMANDS = {
    "K": (":K N|heuristic|auto [K_max]", "drafts per round, or a K policy", set_K),
    "tree": (":tree W1,W2,...|auto|off", "draft a token tree (children per depth) instead of K drafts", set_tree),
    "temperature": (":temperature T", "0 = greedy",
                    set_value("temperature", "temperature", lambda v: number(v, "temperature"))),
    "top_k": (":top_k N|off", "keep the N most likely tokens", set_top_k),
    "top_p": (":top_p P|off", "nucleus: top tokens with mass >= P", set_top_p),
    "sampling": (":sampling MODE [T]", "greedy | plain | top_k N | nucleus P, then T (default 1)", set_sampling),
    "seed": (":seed N", "each run: np.random.default_rng(seed)",
             set_value("seed", "seed", lambda v: integer(v, "seed", 0))),
    "tokens": (":tokens N", "new tokens per run", set_value("tokens", "n_tokens", lambda v: integer(v, "tokens", 1))),
    "speculative": (":speculative [on|off]", "run speculative decoding", set_generator("speculative")),
    "target": (":target [on|off]", "run target-only", set_generator("target")),
    "draft": (":draft [on|off]", "run draft-only (a draft model alone)", set_generator("draft")),
    "compare": (":compare [on|off]", "target-only beside speculative, whatever :target says", set_compare),
    "trace": (":trace [on|off]", "per round: drafts, p(x), q(x), min(1, p/q)", set_switch("trace")),
    "cache": (":cache [on|off]", "KV cache; off: each run again, recomputing all", set_cache),
}
ACTIONS = {
    "drafter": (":drafter ngram|MODEL", "switch: prompt lookup, a model or folder"),
    "clear": (":clear", "clear the screen"),
    "help": (":help", "this help, with every setting's value"),
    "quit": (":quit", "leave (Ctrl-D and Ctrl-C too)"),
}
SLASH_HELP = ("'/' starts the same commands, and those of romsto/Speculative-Decoding's console:\n"
              "  /gamma = :K, /length = :tokens, /processor = :sampling, /debug = :trace, "
              "/drafter [on|off] = :draft, /drafter NAME = :drafter NAME")
ALIASES = {"k": "K", "temp": "temperature", "t": "temperature", "n": "tokens", "n_tokens": "tokens",
           "length": "tokens", "processor": "sampling", "spec": "speculative", "debug": "trace",
           "kv": "cache", "h": "help", "?": "help", "exit": "quit", "q": "quit", "cls": "clear"}


def parse_command(line, settings):
    """One ':' line -> Outcome; raises CommandError (one line) for anything it cannot do."""
    words = line[1:].split()
    if not words:
        raise CommandError("empty command: type :help for the list")
    name, args = ALIASES.get(words[0], words[0]), words[1:]
    if name in ACTIONS:
        if name == "drafter":  # the rest of the line: a folder's name may hold spaces
            exactly(args[:1], 1, ACTIONS[name][0])
            drafter = drafter_name(line[1:].split(None, 1)[1].strip())
            check_tree_drafter(settings.tree, drafter, lambda name: f":{name}")  # before loading it
            return Outcome(settings, action=name, argument=drafter)
        exactly(args, 0, ACTIONS[name][0])
        return Outcome(settings, action=name)
    if name not in COMMANDS:
        raise CommandError(f"unknown command :{words[0]}: type :help for the list")
    new = checked(COMMANDS[name][2](settings, args))
    return Outcome(new, message=describe_change(settings, new, name) + compare_note(new, name))


def drafter_name(text):
    """A drafter as :drafter takes it: ngram and none in any case (as :K AUTO), a folder's ~ expanded as a
    shell would (the library takes paths as they are), anything else as typed.

    >>> drafter_name("NGRAM"), drafter_name("None"), drafter_name("~/m") == os.path.expanduser("~/m")
    ('ngram', 'none', True)
    """
    if text.lower() in ("ngram", report.NO_DRAFTER):
        return text.lower()
    return os.path.expanduser(text)


def compare_note(s, name):
    """What a switch turned off does not stop while compare runs it anyway."""
    if s.compare and name in COMPARED and not getattr(s, name):
        return f" ({GENERATOR_LABELS[name]} still runs: compare is on; :compare off to stop it)"
    return ""


def with_drafter(settings, name):
    """Settings after switching to drafter `name`; draft-only goes off for prompt lookup (no model). From no
    drafter (`:drafter none` turned speculative off), speculative decoding comes back on: that is what a
    drafter is for; from another drafter it stays as it was, and the line says when it is off."""
    new = replace(settings, drafter=name, draft=settings.draft and name != "ngram",
                  speculative=settings.speculative or settings.drafter is None)
    notes = []
    if settings.draft and not new.draft:
        notes.append("draft-only off: prompt lookup has no model to write alone")
    if new.speculative and not settings.speculative:
        notes.append("speculative on")
    elif not new.speculative:
        notes.append("speculative off: :speculative on")
    return new, f"drafter: {name}" + "".join(f" ({note})" for note in notes)


# ---- showing settings -----------------------------------------------------------------------------

def sampling_mode(s):
    """The processor in words, as :sampling would set it."""
    if is_greedy(s.temperature):
        return "greedy"
    parts = ([f"top_k {s.top_k}"] if s.top_k is not None else []) + ([f"nucleus {s.top_p:g}"] if s.top_p else [])
    return f"{' + '.join(parts) or 'plain'} T={s.temperature:g}"


def K_words(s):
    if s.tree is not None:
        return f"tree {tree_words(s.tree)}"
    return f"K={s.K}" if isinstance(s.K, int) else f"K {s.K} <= {s.K_max}"


def tree_words(tree):
    return "off" if tree is None else tree if tree == "auto" else ",".join(map(str, tree))


def setting_values(s):
    """{command: its setting's value in words}, for help and for what a command changed."""
    on = lambda flag: "on" if flag else "off"  # noqa: E731
    K = str(s.K) if isinstance(s.K, int) else f"{s.K} <= {s.K_max}"
    return {"K": K, "tree": tree_words(s.tree), "temperature": f"{s.temperature:g}", "top_k": str(s.top_k or "off"),
            "top_p": f"{s.top_p:g}" if s.top_p else "off", "sampling": sampling_mode(s), "seed": str(s.seed),
            "tokens": str(s.n_tokens), "speculative": on(s.speculative), "target": on(s.target),
            "draft": on(s.draft), "compare": on(s.compare), "trace": on(s.trace),
            "cache": on(s.cache), "drafter": s.drafter or "none"}


def describe_change(old, new, command=None):
    """'temperature: 0.8, sampling: plain, T=0.8' for what a command changed; if nothing, what the command's
    setting already is ('temperature: already 0'), or 'unchanged'."""
    before, after = setting_values(old), setting_values(new)
    changed = ", ".join(f"{name}: {value}" for name, value in after.items() if value != before[name])
    return changed or (f"{command}: already {after[command]}" if command in after else "unchanged")


def help_text(s):
    """Every command with its usage, the current value of its setting, and what it does."""
    values = setting_values(s)
    rows = [(usage, values.get(name, ""), what) for name, (usage, what, _) in COMMANDS.items()]
    rows += [(usage, values.get(name, ""), what) for name, (usage, what) in ACTIONS.items()]
    rows.insert(0, ("command", "now", "what it does"))
    usage_width, value_width = (max(len(row[i]) for row in rows) for i in (0, 1))
    lines = [f"  {usage:<{usage_width}}  {value:<{value_width}}  {what}" for usage, value, what in rows]
    return "\n".join(["anything else is a prompt ('\\n' in it is a newline; '::' or '//' starts one with ':' or '/')",
                      SLASH_HELP, *lines])
