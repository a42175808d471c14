"""An interactive console for speculative decoding: type a prompt, watch where every token comes from.

    python -m gpt2np.console                          # offline: the bundled Shakespeare pair
    python -m gpt2np.console --target_model_size 355M --draft_model_size 124M
    printf ':sampling greedy\\n:compare\\nROMEO:\\n' | python -m gpt2np.console    # from a script

A line is a prompt, or a command starting with ':' (`:help` lists them with every setting's
current value: K or the K policy, sampling, seed, length, drafter, which generators run, the
trace, the KV cache). Per prompt every enabled generator runs in turn (target-only, target-only
without the KV cache, draft-only, speculative), each from a fresh np.random.default_rng(seed),
its tokens printed as they are generated, then its tokens per second from the package's own
timings; speculative runs add a one-line statistics summary and the speedup over target-only.
Tokens are coloured by provenance (green accepted draft, red resample, blue bonus) when the
output is a terminal and NO_COLOR is unset. It only calls the package: no sampler of its own.
"""
import argparse
import os
import sys
import time

import gpt2np  # before NumPy: OpenBLAS's thread timeout (gpt2np/__init__.py)
import numpy as np

from .console_commands import GENERATORS, CommandError, Settings, apply, help_text
from .download import DownloadError
from .drafters import ModelDrafter
from .report import OneLineErrorParser, TokenTexts, coloured, stats_summary

DEFAULT_TARGET, DEFAULT_DRAFT = "shakespeare-2.6M", "shakespeare-260K"


class Console:
    """The models, the settings, and one method per kind of input line."""

    def __init__(self, target, settings, load_drafter, out=sys.stdout, colour=False):
        self.target, self.settings, self.load_drafter = target, settings, load_drafter
        self.out, self.colour, self.drafters = out, colour, {}
        self.drafter()  # the starting drafter loads now: a bad name fails before the first prompt

    def write(self, text):
        self.out.write(text)
        self.out.flush()

    def drafter(self):
        name = self.settings.drafter
        if name not in self.drafters:
            self.drafters[name] = self.load_drafter(name)
            if isinstance(self.drafters[name], ModelDrafter):
                self.drafters[name].check(self.target, [0], 1)  # same vocabulary, or a one-line error
        return self.drafters[name]

    def handle(self, line):
        """One input line. Returns False to quit."""
        line = line.strip()
        if not line:
            return True
        if not line.startswith(":"):
            self.generate(line)
            return True
        name, *args = line[1:].split()
        if name in ("quit", "q", "exit"):
            return False
        if name == "help":
            self.write(help_text(self.settings) + "\n")
        elif name == "clear":
            self.write("\033[2J\033[H" if self.colour else "")
        elif name == "drafter":
            self.switch_drafter(args)
        else:
            self.write(apply(self.settings, name, args) + "\n")
        return True

    def switch_drafter(self, args):
        if len(args) != 1:
            raise CommandError(":drafter ngram | MODEL (a size, bundled name or folder)")
        old, self.settings.drafter = self.settings.drafter, args[0]
        try:
            self.write(f"drafter: {self.drafter().name}\n")
        except (ValueError, OSError, DownloadError) as e:
            self.settings.drafter = old
            raise CommandError(str(e).splitlines()[0]) from None

    def streams(self, prompt_ids):
        """(label, stream factory) for every enabled generator, in GENERATORS order."""
        s, target = self.settings, self.target
        sampling = s.sampling()
        rng = lambda: np.random.default_rng(s.seed)  # noqa: E731  a fresh generator per run
        drafter = self.drafter()
        makers = {
            "target": lambda: gpt2np.plain_stream(target, prompt_ids, s.n_tokens, rng=rng(), **sampling),
            "nocache": lambda: gpt2np.plain_stream(target, prompt_ids, s.n_tokens, rng=rng(), use_cache=False,
                                                   **sampling),
            "draft": lambda: gpt2np.plain_stream(drafter.model, prompt_ids, s.n_tokens, rng=rng(), **sampling),
            "speculative": lambda: gpt2np.speculative_stream(target, drafter, prompt_ids, s.n_tokens, s.K,
                                                             s.K_max, rng=rng(), trace=s.trace, **sampling),
        }
        labels = {"target": f"target-only: {target.name}", "nocache": f"target-only, no KV cache: {target.name}",
                  "draft": f"draft-only: {drafter.name}",
                  "speculative": f"speculative: {drafter.name} -> {target.name}, K {s.K}"}
        for name in GENERATORS:
            if name not in s.generators:
                continue
            if name == "draft" and not isinstance(drafter, ModelDrafter):
                self.write(f"--- draft-only: not available with {drafter.name} (prompt lookup has no model)\n")
                continue
            yield name, labels[name], makers[name]

    def generate(self, prompt):
        ids = self.target.tokenizer.encode(prompt) or [self.target.eot_id]
        plans = list(self.streams(ids))  # every check before any work
        streams = [(name, label, make()) for name, label, make in plans]
        seconds = {}
        if not streams:
            self.write("no generator is on: :on target speculative (see :help)\n")
        for name, label, stream in streams:
            seconds[name] = self.show(label, prompt, stream)
            if name == "speculative" and stream.result is not None:
                speedup = seconds["target"] / seconds[name] if "target" in seconds else None
                self.write(stats_summary(stream.result.stats, speedup) + "\n")

    def show(self, label, prompt, stream):
        """Print one generator's tokens as they come; returns its seconds (calibration excluded)."""
        self.write(f"--- {label} ---\n{prompt}")
        texts, start = TokenTexts(self.target.tokenizer), time.perf_counter()
        try:
            for event in stream:
                self.write(coloured(texts.pieces(event.tokens), event.provenance, self.colour))
                if self.settings.trace and event.record is not None:
                    self.write("\n" + trace_line(self.target.tokenizer, event) + "\n")
        except KeyboardInterrupt:
            stream.close()
            self.write(texts.flush() + "\n[interrupted]\n")
            raise
        seconds = time.perf_counter() - start - getattr(getattr(stream.result, "stats", None), "calibration_seconds", 0)
        n = len(stream.tokens)
        self.write(f"{texts.flush()}\n» {n} tokens in {seconds:.3f} s: {n / seconds:.1f} tokens/s\n")
        return seconds


def trace_line(tokenizer, event):
    """One round of the debug trace: each draft with p(x), q(x), min(1, p/q) and the decision."""
    show = lambda t: repr(tokenizer.decode([t]))  # noqa: E731
    parts = []
    for i, x in enumerate(event.drafts):
        p, q = event.p_at_drafts[i], event.q_at_drafts[i]
        verdict = ("accept" if event.decisions[i] else "REJECT") if i < len(event.decisions) else "not examined"
        parts.append(f"{show(x)} p={p:.3f} q={q:.3f} min(1,p/q)={min(1.0, p / q):.3f} {verdict}")
    last = f"{event.provenance[-1]} {show(event.tokens[-1])}"
    return f"  [round: K={event.K}, {len(event.drafts)} drafted] " + "; ".join(parts) + (" -> " if parts else "") + last


def parse_args(argv):
    p = OneLineErrorParser(prog="python -m gpt2np.console", description=__doc__.split("\n")[0])
    p.add_argument("--target_model_size", default=DEFAULT_TARGET, help="size name, bundled name or folder")
    p.add_argument("--draft_model_size", default=DEFAULT_DRAFT, help="draft model, or ngram (prompt lookup)")
    p.add_argument("--models_dir", default="weights", help="where release sizes are downloaded to")
    p.add_argument("--mirror", default=None, help="base URL of a mirror of OpenAI's release")
    p.add_argument("--ngram_max", type=int, default=3, help="longest n-gram prompt lookup tries")
    p.add_argument("--K", default="4", help="drafts per round, or heuristic / auto")
    p.add_argument("--K_max", type=int, default=8, help="bound of heuristic / auto")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top_k", type=int, default=None)
    p.add_argument("--top_p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0, help="seed of each run's np.random.Generator")
    p.add_argument("--n_tokens_to_generate", type=int, default=60)
    p.add_argument("--threads", type=int, default=None, help="BLAS threads (default: 1 below n_embd 512)")
    return p.parse_args(argv)


def settings_from(args):
    """Settings from the flags, each checked by the command that would set it (one-line errors)."""
    s = Settings(drafter=args.draft_model_size)
    for name, value in [("K_max", args.K_max), ("K", args.K), ("temperature", args.temperature),
                        ("top_k", args.top_k), ("top_p", args.top_p), ("seed", args.seed),
                        ("n", args.n_tokens_to_generate)]:
        apply(s, name, [str(value)])
    if args.ngram_max < 1:
        raise CommandError(f"--ngram_max must be at least 1, got {args.ngram_max}")
    return s


def read_lines(interactive):
    """Input lines; with a terminal, a prompt and readline's editing and history."""
    if interactive:
        try:
            import readline  # noqa: F401  (line editing and history where the platform has it)
        except ImportError:
            pass
    while True:
        try:
            yield input("> ") if interactive else next(sys.stdin)
        except (EOFError, StopIteration):
            return


def run(console, interactive):
    """The loop: a bad command prints one line and the console goes on; Ctrl-C at a prompt leaves."""
    for line in read_lines(interactive):
        try:
            if not console.handle(line):
                return
        except KeyboardInterrupt:
            continue  # a generation was stopped: back to the prompt
        except (CommandError, ValueError) as e:
            console.write(f"error: {str(e).splitlines()[0]}\n")


def main(argv=None):
    args = parse_args(argv)
    settings = settings_from(args)
    from threadpoolctl import threadpool_limits
    target = gpt2np.load_model(args.target_model_size, args.models_dir, base_url=args.mirror)
    threads = args.threads or (1 if target.config.n_embd < 512 else None)
    if threads:
        threadpool_limits(limits=threads, user_api="blas")
    drafter = lambda name: gpt2np.load_drafter(name, args.models_dir, args.mirror, n_max=args.ngram_max)  # noqa: E731
    colour = sys.stdout.isatty() and "NO_COLOR" not in os.environ
    console = Console(target, settings, drafter, colour=colour)
    interactive = sys.stdin.isatty()
    if interactive:
        console.write(f"gpt2np console: target {target.name}, drafter {console.drafter().name}. "
                      ":help for commands, :quit to leave.\n")
    run(console, interactive)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print()
        sys.exit(0)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    except (ValueError, OSError, DownloadError) as e:  # bad flags, models, files: one line, status 2
        print(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        sys.exit(2)
