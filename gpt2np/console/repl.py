"""python -m gpt2np.console: type a prompt, watch speculative decoding write it, change settings, repeat.

    python -m gpt2np.console                          # offline: the bundled Shakespeare pair
    python -m gpt2np.console --target_model_size 355M --draft_model_size 124M --K auto
    printf ':temperature 0\\nROMEO:\\n:quit\\n' | python -m gpt2np.console   # a script on stdin

Tokens stream as each round produces them, coloured by where they came from (green accepted
draft, red target resample, blue bonus; only on a terminal without NO_COLOR), then one line of
statistics per generator and, when several ran, a table of their throughput side by side.
Lines starting with ':' are commands (:help lists them with every setting's value;
commands.py parses them); runs.py is the only place that calls the decoders.
The console this replaces (the seed's infer.py) counted characters as tokens, reseeded the global
generators and timed its draft-only run with the target's clock; here throughput is tokens per
second from the decoders' own timings, and every run has its own np.random.default_rng(seed).
"""
import argparse
import os
import sys

import gpt2np  # before NumPy: it sets OpenBLAS's thread timeout (gpt2np/__init__.py)
from threadpoolctl import threadpool_limits

from .commands import (GENERATOR_LABELS, CommandError, Settings, K_words, checked, help_text,
                               parse_command, with_drafter)
from .display import speedup_table, trace_lines
from .runs import Run, consume, open_stream, without_cache
from gpt2np import DownloadError, check_same_vocabulary, is_greedy
from ..report import OneLineErrorParser, TokenTexts, coloured, provenance_legend, stats_summary

DEFAULT_TARGET, DEFAULT_DRAFT = "shakespeare-2.6M", "shakespeare-260K"  # gpt2np/bundled/
CLEAR_SCREEN = "\033[H\033[2J"
LOAD_ERRORS = (ValueError, OSError, DownloadError)  # bad names, missing or corrupt files, HTTP


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action):  # "(default: None)" says nothing: those helps say it in words
        return action.help if action.default is None else super()._get_help_string(action)


def parse_args(argv):
    p = OneLineErrorParser(prog="python -m gpt2np.console", description=__doc__.split("\n")[0],
                           formatter_class=HelpFormatter)
    p.add_argument("--target_model_size", default=None,
                   help=f"target: a size name (124M ...), a bundled name or a folder (default: {DEFAULT_TARGET})")
    p.add_argument("--draft_model_size", default=None,
                   help=f"drafter: a model name or folder, or 'ngram' (prompt lookup) (default with the default "
                        f"target: {DEFAULT_DRAFT}; with another target: none until :drafter)")
    p.add_argument("--ngram_max", type=int, default=3, help="prompt lookup's longest n-gram")
    p.add_argument("--models_dir", default="weights", help="where OpenAI's release sizes are downloaded to")
    p.add_argument("--mirror", default=None,
                   help="base URL of a mirror of OpenAI's release (default: $GPT2NP_MIRROR, else OpenAI's own)")
    p.add_argument("--K", default="4", help="draft tokens per round, or 'heuristic' / 'auto'")
    p.add_argument("--K_max", type=int, default=8, help="the bound of the heuristic and auto K policies")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature; 0 means greedy")
    p.add_argument("--top_k", type=int, default=None, help="keep only the k most likely tokens (default: all)")
    p.add_argument("--top_p", type=float, default=None, help="nucleus sampling threshold in (0, 1] (default: off)")
    p.add_argument("--seed", type=int, default=0, help="seed of each run's np.random.Generator")
    p.add_argument("--n_tokens_to_generate", type=int, default=None,
                   help="new tokens per run (default: 200 with the bundled pair, 40 otherwise)")
    p.add_argument("--threads", type=int, default=None,
                   help="BLAS threads (default: 1 for models narrower than n_embd 512, else the BLAS default)")
    return p.parse_args(argv)


def initial_settings(args):
    """Settings from the flags, checked like the commands that change them (one-line ValueError)."""
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be at least 1, got {args.threads}")
    if args.ngram_max < 1:
        raise ValueError(f"--ngram_max must be at least 1, got {args.ngram_max}")
    drafter = args.draft_model_size or (DEFAULT_DRAFT if args.target_model_size is None else None)
    n_tokens = args.n_tokens_to_generate
    if n_tokens is None:
        n_tokens = 200 if args.target_model_size is None else 40
    if n_tokens < 1:
        raise ValueError(f"--n_tokens_to_generate must be positive, got {n_tokens}")
    K = args.K if args.K in ("heuristic", "auto") else int(args.K) if args.K.lstrip("-").isdigit() else args.K
    return checked(Settings(K=K, K_max=args.K_max, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, seed=args.seed, n_tokens=n_tokens, drafter=drafter,
                            speculative=drafter is not None, target=drafter is None))


def one_line(error):
    return str(error).splitlines()[0] if str(error) else type(error).__name__


class Console:
    """The settings, the loaded models, and what each typed line does. write / warn print."""

    def __init__(self, target, settings, load_drafter, out=sys.stdout, err=sys.stderr):
        self.target, self.settings, self.load_drafter = target, settings, load_drafter
        self.drafters = {}  # name -> drafter: switching back to one loaded before costs nothing
        self.out, self.err = out, err
        self.colour = out.isatty() and "NO_COLOR" not in os.environ

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
        """Do what one typed line says; False means quit."""
        line = line.strip()
        if line.startswith(":") and not line.startswith("::"):
            return self.command(line)
        if line:
            self.generate(line[1:] if line.startswith("::") else line)
        return True

    def command(self, line):
        try:
            outcome = parse_command(line, self.settings)
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
            self.settings = outcome.settings
            self.write(outcome.message)
        return True

    def switch_drafter(self, name):
        """Load (or reuse) the named drafter; on any error keep the current one."""
        try:
            self.drafter_named(name)
        except LOAD_ERRORS as e:
            self.warn(f"drafter {name!r} not loaded: {one_line(e)}")
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
        try:  # every check (context length, sampling options, K) before any forward pass
            streams = {g: open_stream(g, self.target, self.drafter, prompt_ids, s) for g in s.enabled()}
        except ValueError as e:
            self.warn(one_line(e))
            return
        runs = []
        try:
            for generator, stream in streams.items():
                runs.append(self.run(generator, stream, prompt, runs))
                if not s.cache and generator != "speculative":
                    runs.append(self.run_without_cache(generator, prompt, prompt_ids, runs[-1]))
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

    def run(self, generator, stream, prompt, runs):
        """Print one generator's tokens as they stream in, then its one-line summary."""
        s, label = self.settings, GENERATOR_LABELS[generator]
        name = (f"{self.target.name}, drafter {s.drafter}, {K_words(s)}" if generator == "speculative"
                else self.model_of(generator).name)
        self.write(f"=== {label} ({name}) ===")
        texts, traces = TokenTexts(self.target.tokenizer), []
        self.out.write(prompt)

        def show(event):
            self.out.write(coloured(texts.pieces(event.tokens), event.provenance, self.colour))
            self.out.flush()
            if s.trace and generator == "speculative":
                traces.append(trace_lines(event, len(traces) + 1, self.target.tokenizer))
        seconds = consume(stream, show)
        self.write(texts.flush())
        if traces:
            self.write("trace (p = target, q = draft; a draft is accepted with probability min(1, p/q)):\n"
                       + "\n".join(sum(traces, [])))
        stats = stream.result.stats if generator == "speculative" else None
        run = Run(label, name, stream.tokens, seconds, stats)
        line = f"{label}: {len(run.tokens)} tokens in {seconds:.3f} s, {run.tokens_per_second:.1f} tokens/s"
        if stats is not None:
            if self.colour:
                self.write(provenance_legend(stream.provenance, self.colour))
            base = next((r for r in runs if r.label == "target-only"), None)
            speedup = base and run.tokens_per_second / base.tokens_per_second
            line += " | " + stats_summary(stats, measured_speedup=speedup)
        self.write(line)
        return run

    def run_without_cache(self, generator, prompt, prompt_ids, cached):
        """The same plain run recomputing the whole context each step, timed beside the cached one."""
        label, model = f"{GENERATOR_LABELS[generator]}, no KV cache", self.model_of(generator)
        self.write(f"=== {label} ({model.name}) ===")
        self.out.flush()
        tokens, seconds = without_cache(model, prompt_ids, self.settings)
        run = Run(label, model.name, tokens, seconds)
        self.write(prompt + self.target.tokenizer.decode(tokens))
        self.write(f"{label}: {len(tokens)} tokens in {seconds:.3f} s, {run.tokens_per_second:.1f} tokens/s; "
                   f"the KV cache is {cached.tokens_per_second / run.tokens_per_second:.2f}x faster")
        return run


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
    target = gpt2np.load_model(args.target_model_size or DEFAULT_TARGET, args.models_dir, base_url=args.mirror)
    threads = args.threads or (1 if target.config.n_embd < 512 else None)  # small products: 1 is faster
    if threads:
        threadpool_limits(limits=threads, user_api="blas")

    def load_drafter(name):
        return gpt2np.load_drafter(name, args.models_dir, base_url=args.mirror, n_max=args.ngram_max)
    console = Console(target, settings, load_drafter)
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
    interactive = sys.stdin.isatty()
    if interactive:
        import readline  # noqa: F401  (importing it gives input() line editing and history)
        print(f"gpt2np console: target {console.target.name}, drafter {console.settings.drafter or 'none'}. "
              "Type a prompt, or :help. Ctrl-D quits.")
    for line in typed_lines(sys.stdin, interactive):
        if not console.handle(line):
            break
    return 0
