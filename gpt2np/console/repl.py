"""python -m gpt2np.console: type a prompt, watch speculative decoding write it, change settings, repeat.

    python -m gpt2np.console                          # offline: the bundled Shakespeare pair
    python -m gpt2np.console --target_model_size 355M --draft_model_size 124M --K auto
    printf ':temperature 0\\nROMEO:\\n:quit\\n' | python -m gpt2np.console   # a script on stdin

Tokens stream as each round produces them, coloured by where they came from (green accepted
draft, red target resample, blue bonus; only on a terminal, without NO_COLOR or TERM=dumb), then one line of
statistics per generator and, when several ran, a table of their throughput side by side.
Lines starting with ':' or '/' are commands (:help lists them with every setting's value;
commands.py parses them, slash.py maps the '/' names); flags.py holds the command line;
runs.py is the only place that calls the decoders.
The console this replaces (the seed's infer.py) counted characters as tokens, reseeded the global
generators and timed its draft-only run with the target's clock; here throughput is tokens per
second from the decoders' own timings, and every run has its own np.random.default_rng(seed).
"""
import sys
from dataclasses import replace

import gpt2np  # before NumPy: it sets OpenBLAS's thread timeout (gpt2np/__init__.py)
from threadpoolctl import threadpool_limits

from .commands import GENERATOR_LABELS, CommandError, K_words, help_text, with_drafter
from .display import speedup_table, trace_lines
from .flags import DEFAULT_TARGET, initial_settings, parse_args
from .runs import Run, consume, open_stream
from .slash import command_word, parse_typed
from gpt2np import DownloadError, check_same_vocabulary, is_greedy
from ..report import (NO_DRAFTER, TokenTexts, check_tokenizer, colour_allowed, coloured, drafter_errors,
                      provenance_legend, stats_summary)
from ..report import command_error_line as one_line  # errors name the console's flags

CLEAR_SCREEN = "\033[H\033[2J"
LOAD_ERRORS = (ValueError, OSError, DownloadError)  # bad names, missing or corrupt files, HTTP
NO_CACHE = ", no KV cache"  # the label's suffix for a run recomputing the whole context


class Console:
    """The settings, the loaded models, and what each typed line does. write / warn print."""

    def __init__(self, target, settings, load_drafter, out=sys.stdout, err=sys.stderr):
        self.target, self.settings, self.load_drafter = target, settings, load_drafter
        self.drafters = {}  # name -> drafter: switching back to one loaded before costs nothing
        self.out, self.err = out, err
        self.colour = colour_allowed(out)

    def write(self, text=""):
        self.out.write(text + "\n")
        self.out.flush()

    def warn(self, text):
        self.out.flush()
        self.err.write(f"error: {text}\n")
        self.err.flush()

    @property
    def drafter(self):
        return self.drafters.get(self.settings.drafter)

    def drafter_named(self, name):
        """The named drafter, loaded once and checked against the target's vocabulary."""
        if name not in self.drafters:
            drafter = self.load_drafter(name)
            if hasattr(drafter, "model"):  # prompt lookup has no vocabulary of its own
                check_same_vocabulary(self.target, drafter.model)
            self.drafters[name] = drafter
        return self.drafters[name]

    def handle(self, line):
        """Do what one typed line says; False means quit. A prompt is encoded as typed, its spaces kept (as
        main.py's --prompt: on the bundled byte-level vocabulary "ROMEO: " continues otherwise than "ROMEO:");
        a line of spaces alone is nothing, and a command's own spaces do not matter."""
        text, line = line.rstrip("\r\n"), line.strip()
        if line.startswith((":", "/")) and not line.startswith(("::", "//")):
            return self.command(line)
        if line:
            escaped = text.index(line[0]) if line.startswith(("::", "//")) else None  # "::x" is the prompt ":x"
            self.generate(text if escaped is None else text[:escaped] + text[escaped + 1:])
        return True

    def command(self, line):
        try:
            outcome = parse_typed(line, self.settings)
        except CommandError as e:
            self.warn(str(e))
            return True
        if outcome.action == "quit":
            return False
        if outcome.action == "help":
            self.write(help_text(self.settings))
        elif outcome.action == "clear":
            self.out.write(CLEAR_SCREEN if self.out.isatty() else "")
            self.out.flush()
        elif outcome.action == "drafter":
            self.switch_drafter(outcome.argument)
        else:
            try:
                if outcome.settings.n_tokens != self.settings.n_tokens:
                    self.check_tokens(outcome.settings.n_tokens, command_word(line))  # :tokens, /length, :n
            except CommandError as e:
                self.warn(str(e))
                return True
            self.settings = outcome.settings
            self.write(outcome.message)
        return True

    def check_tokens(self, n_tokens, named):
        """n_tokens new tokens fit the target's context after a prompt of one token, or a CommandError
        naming the limit (when set, not at every prompt); named: the command as typed (:tokens, /length)
        or --n_tokens_to_generate."""
        room = self.target.n_ctx - 1
        if n_tokens > room:
            raise CommandError(f"{named} {n_tokens}: at most {room} new tokens fit the target's context of "
                               f"{self.target.n_ctx} tokens (a prompt takes at least one)")

    def switch_drafter(self, name):
        """Load (or reuse) the named drafter; on any error keep the current one. none: no drafter, target-only."""
        if name == NO_DRAFTER:
            self.settings = replace(self.settings, drafter=None, speculative=False, compare=False, draft=False,
                                    target=True)
            self.write("drafter: none (target-only on; speculative, compare and draft-only off)")
            return
        current = self.settings.drafter or NO_DRAFTER
        try:
            if name not in self.drafters and name != "ngram":  # a download or a large model takes a while
                self.write(f"loading drafter {name} ... (Ctrl-C: keep {current})")
            self.drafter_named(name)
        except LOAD_ERRORS as e:
            self.warn(f"drafter {name!r} not loaded: {one_line(e)}")
            return
        except KeyboardInterrupt:  # the console stays, and so does its drafter
            self.warn(f"interrupted: drafter {name!r} not loaded; the drafter is still {current}")
            return
        self.settings, message = with_drafter(self.settings, name)
        self.write(message)

    def generate(self, text):
        """Run every enabled generator on one prompt; Ctrl-C stops the runs, not the console."""
        s, prompt = self.settings, text.replace("\\n", "\n")
        if not s.enabled():
            self.warn("every generator is off: switch one on (:speculative, :target or :draft)")
            return
        prompt_ids = self.target.tokenizer.encode(prompt) or [self.target.eot_id]
        plan = [(g, use_cache) for g in s.enabled() for use_cache in ((True,) if s.cache else (True, False))]
        try:  # every check (context length, sampling options, K) before any forward pass
            streams = {(g, c): open_stream(g, self.target, self.drafter, prompt_ids, s, c) for g, c in plan}
        except ValueError as e:  # the library says n_tokens: the console's setting is :tokens
            self.warn(one_line(e).replace("+ n_tokens (", "+ :tokens ("))
            return
        runs = []
        try:
            for (generator, use_cache), stream in streams.items():
                runs.append(self.run(generator, stream, prompt, runs, use_cache))
        except KeyboardInterrupt:
            for stream in streams.values():
                stream.close()
            self.write()
            self.warn("interrupted: back to the prompt (Ctrl-C again, Ctrl-D or :quit to leave)")
            return
        if len(runs) > 1:
            self.write(speedup_table(runs, greedy=is_greedy(s.temperature)))

    def model_of(self, generator):
        return self.target if generator == "target" else self.drafter.model

    def run(self, generator, stream, prompt, runs, use_cache=True):
        """Print one generator's tokens as they stream in, then its one-line summary."""
        s, label = self.settings, GENERATOR_LABELS[generator] + ("" if use_cache else NO_CACHE)
        name = (f"{self.target.name}, drafter {s.drafter}, {K_words(s)}" if generator == "speculative"
                else self.model_of(generator).name)
        self.write(f"=== {label} ({name}) ===")
        texts, traces = TokenTexts(self.target.tokenizer), []
        self.out.write(prompt)

        def show(event):
            self.out.write(coloured(texts.pieces(event.tokens), event.provenance, self.colour))
            self.out.flush()
            if s.trace and generator == "speculative" and use_cache:  # the no-cache run repeats it
                traces.append(trace_lines(event, len(traces) + 1, self.target.tokenizer, is_greedy(s.temperature),
                                          no_drafts_why(s)))
        seconds = consume(stream, show)
        self.write(texts.flush())
        if traces:
            self.write("trace (p = target, q = draft; a draft is accepted with probability min(1, p/q)):\n"
                       + "\n".join(sum(traces, [])))
        run = Run(label, name, stream.tokens, seconds, stream.result.stats if generator == "speculative" else None)
        self.write(summary_line(run, runs, stream.provenance, self.colour, use_cache))
        return run


def no_drafts_why(s):
    """Why a speculative round drafted nothing, for the trace: a K policy's choice of 0, or prompt lookup
    finding no earlier match (a fixed K, or a tree, asks for drafts every round)."""
    if s.drafter != "ngram":
        return "K=0"
    if s.tree is None and not isinstance(s.K, int):
        return "K=0, or prompt lookup found no match"
    return "prompt lookup found no match"


def summary_line(run, runs, provenance, colour, use_cache):
    """'label: N tokens in s, tokens/s', then a speculative run's statistics against target-only
    (with the same cache setting), then what the KV cache bought (runs without it)."""
    line = (f"{run.label}: {len(run.tokens)} token{'' if len(run.tokens) == 1 else 's'} in {run.seconds:.3f} s, "
            f"{run.tokens_per_second:.1f} tokens/s")
    by_label = {r.label: r for r in runs}
    if run.stats is not None:
        base = by_label.get(GENERATOR_LABELS["target"] + ("" if use_cache else NO_CACHE))
        speedup = base and run.tokens_per_second / base.tokens_per_second
        line = (provenance_legend(provenance, colour) + "\n" if colour else "") + line
        line += " | " + stats_summary(run.stats, measured_speedup=speedup)
        line += "" if speedup or run.stats.predicted_speedup_refined is None else " (:compare on measures it)"
    cached = by_label.get(run.label.removesuffix(NO_CACHE))
    if not use_cache and cached is not None:  # with one token there is nothing to reuse: it may lose
        ratio = cached.tokens_per_second / run.tokens_per_second
        line += f"; the KV cache is {ratio:.2f}x faster" if ratio >= 1 else f"; the KV cache is {1 / ratio:.2f}x slower"
    return line


def typed_lines(stdin, interactive):
    """Lines as the user types them (readline editing and history on a terminal), or a script's lines."""
    while True:
        if interactive:
            try:
                yield input("gpt2np> ")
            except EOFError:  # Ctrl-D
                print()
                return
        else:
            line = stdin.readline()
            if not line:
                return
            yield line.rstrip("\r\n")


def load(args, settings):
    """The target, BLAS threads for its size, and a Console holding the first drafter."""
    sources = dict(base_url=args.mirror, hf_endpoint=args.hf_endpoint)
    name = args.target_model_size or DEFAULT_TARGET
    check_tokenizer(name, args.models_dir, "to encode prompts with")  # before the weights are built
    target = gpt2np.load_model(name, args.models_dir, **sources)
    threads = args.threads or (1 if target.config.n_embd < 512 else None)  # small products: 1 is faster
    if threads:
        threadpool_limits(limits=threads, user_api="blas")

    def load_drafter(name):  # an unknown name's error lists ngram and none too
        with drafter_errors():
            return gpt2np.load_drafter(name, args.models_dir, n_max=args.ngram_max, target=target, **sources)
    console = Console(target, settings, load_drafter)
    if args.n_tokens_to_generate is not None:  # refused now, not at every prompt
        console.check_tokens(settings.n_tokens, "--n_tokens_to_generate")
    if settings.drafter is not None:
        console.drafter_named(settings.drafter)
    return console


def main(argv=None):
    """Returns the exit status: 0 after :quit or end of input, 130 after Ctrl-C, 2 for bad flags."""
    args = parse_args(argv)
    try:
        console = load(args, initial_settings(args))
    except LOAD_ERRORS as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    if sys.stdin is None:  # stdin closed (<&-): no lines to read, as at the end of input
        return 0
    interactive = sys.stdin.isatty()
    if interactive:
        import readline  # noqa: F401  (importing it gives input() line editing and history)
        print(f"gpt2np console: target {console.target.name}, drafter {console.settings.drafter or 'none'}. "
              "Type a prompt, or :help (or /help). Ctrl-D quits.")
    for line in typed_lines(sys.stdin, interactive):
        if not console.handle(line):
            break
    return 0
