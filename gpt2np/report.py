"""Plain-text reporting shared by main.py, the classroom command and the notebooks."""
import argparse
import codecs
import contextlib
import difflib
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from .checkpoints import download, hub, loading
from .decoding.policies import POLICIES
from .decoding.tree_drafts import check_widths
from .decoding.tree_shape import tree_size

# ANSI colours for where each speculative token came from (see speculative.py); "rejected" is the
# draft the target rejected in a round, shown before the target's replacement (struck through, dim)
PROVENANCE_COLOURS = {"draft": "\033[32m", "resample": "\033[31m", "bonus": "\033[34m", "target": "",
                      "rejected": "\033[9;2m"}
PROVENANCE_LABELS = {"draft": "accepted draft token", "rejected": "draft the target rejected (not in the text)",
                     "resample": "target resample (after a rejection)",
                     "bonus": "target bonus token (all K drafts accepted)",
                     "target": "target token, no drafts this round (plain step)"}
TREE_BONUS_LABEL = "target bonus token (a whole path of the tree accepted, to a leaf)"  # a tree run's bonus
# the same in plain text (a pipe, a file, NO_COLOR): labelled spans; a plain step stays unmarked
PROVENANCE_MARKERS = {"draft": "accepted", "rejected": "rejected", "resample": "resampled", "bonus": "bonus"}
RESET = "\033[0m"
# a tree a command's user types: at most this many children a node, as the server's (serve/schemas.py), and this
# many nodes a round: the target rows speculative.py keeps past the run for a tree (TREE_ROOM; a bigger tree would
# be cut to them every round). tree auto's shapes stay within 4 and 15 (tree_policy.py).
TREE_MAX_WIDTH, TREE_MAX_NODES = 8, 64
# a library message names the environment variable; a command names its flag too (every command has both)
COMMAND_HINTS = ((download.HINT, download.mirror_hint(f"--mirror (or ${download.MIRROR_ENV})")),
                 (hub.HINT, hub.hub_hint(f"--hf_endpoint (or ${hub.ENDPOINT_ENV})")),
                 ("(models_dir)", "(--models_dir)"))  # download.py: where to download instead
# a library error that starts with its argument's name (loading.check_models_dir) names the command's flag
LIBRARY_ARGUMENTS = ("models_dir ",)


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's "(default: ...)" after a flag's help, unless the help states its default itself or there
    is none: no "(default: None)", and no second default after one the help words (every command's --help)."""

    def _get_help_string(self, action):
        if "default" in (action.help or "") or action.default in (None, argparse.SUPPRESS):
            return action.help
        return super()._get_help_string(action)


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but a usage error is ONE line on stderr (and exit status 2, as argparse's), and the
    usage names the command as it was run: an installed command (gpt2np, gpt2np-console, ...) by its
    own name, `python main.py` / `python -m ...` (prog) otherwise."""

    def __init__(self, prog=None, **kwargs):
        super().__init__(prog=command_name(prog), **kwargs)

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}{self.did_you_mean(message)} (see --help)\n")

    def did_you_mean(self, message):  # -> " (did you mean --flag?)" for argparse's unrecognized arguments, or ""
        """The known flag closest to each unrecognized one (`--traget_model_size` -> --target_model_size),
        as Python 3.12's argparse suggests choices; nothing where no flag is close."""
        if not message.startswith("unrecognized arguments: "):
            return ""
        known = [s for action in self._actions for s in action.option_strings if s.startswith("--")]
        typed = [word.split("=")[0] for word in message.split(": ", 1)[1].split() if word.startswith("--")]
        close = [difflib.get_close_matches(word, known, n=1, cutoff=0.75) for word in typed]
        hints = [(word, match[0]) for word, match in zip(typed, close) if match]
        if len(hints) == 1:
            return f" (did you mean {hints[0][1]}?)"
        return f" (did you mean {', '.join(f'{m} for {w}' for w, m in hints)}?)" if hints else ""


def command_name(prog, argv0=None):
    """The name a command's usage and errors give it: an installed command's own name (pip's console
    scripts: gpt2np, gpt2np-serve, ...), `python -m gpt2np` for main.py's command run as the package,
    else prog (how it runs from the repository).

    >>> command_name("python main.py", "/venv/bin/gpt2np"), command_name("python main.py", "main.py")
    ('gpt2np', 'python main.py')
    >>> command_name("python main.py", "/venv/lib/site-packages/gpt2np/__main__.py")
    'python -m gpt2np'
    """
    path = sys.argv[0] if argv0 is None and sys.argv else argv0 or ""
    invoked = os.path.basename(path).removesuffix(".exe").removesuffix("-script.py")  # Windows' launchers
    if invoked == "__main__.py" and os.path.basename(os.path.dirname(path)) == "gpt2np":
        return "python -m gpt2np"
    return invoked if invoked.startswith("gpt2np") and not invoked.endswith(".py") else prog


def colour_allowed(stream):
    """ANSI colours on this stream: a terminal that shows them, unless NO_COLOR is set (no-color.org)
    or TERM=dumb (a terminal that has no colours: Emacs' shell, some CI logs)."""
    return stream.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def K_from_text(text):  # -> a K policy's name, or an int
    """K as a command line spells it: "heuristic" or "auto" as is, else an integer (a ValueError if it is
    neither; make_policy checks the range). Each command words its own error."""
    return text if text in POLICIES[1:] else int(text)


def tree_from_text(text):  # -> "auto", or the widths per depth
    """A token tree as a command line spells it: "auto", or children per depth "3,2,1" -> (3, 2, 1)
    (a ValueError unless they are integers >= 1). Each command words its own error."""
    if text == "auto":
        return text
    widths = tuple(int(w) for w in text.split(","))
    if min(widths) < 1:
        raise ValueError(f"tree widths must be >= 1, got {text!r}")
    return widths


def tree_nodes(widths):  # -> the nodes a tree of these widths drafts: (3, 2, 1) -> 3 + 6 + 6 = 15
    return tree_size(tuple(widths))


def check_tree_size(widths):  # -> widths, or a ValueError naming the caps
    """A tree a command's user typed, within TREE_MAX_WIDTH and TREE_MAX_NODES (check_typed_tree words it)."""
    return check_widths(widths, TREE_MAX_WIDTH, TREE_MAX_NODES)


def check_typed_tree(widths, typed):  # -> widths, or a one-line ValueError naming the caps and what was typed
    """check_tree_size, its error worded for a command's user: the tree as typed (`typed`), what is too big."""
    try:
        return check_tree_size(widths)
    except ValueError:
        shown = typed if len(typed) <= 40 else typed[:37] + "..."
        got = f"{max(widths)} children a node" if max(widths) > TREE_MAX_WIDTH else f"{tree_nodes(widths)} nodes"
        raise ValueError(f"tree {shown!r} is too big: at most {TREE_MAX_WIDTH} children a node and "
                         f"{TREE_MAX_NODES} nodes in all (3,2,1 drafts 15), got {got}") from None


def check_drafts_given(K_given, tree, drafting, drafter_flag, named=lambda dest: f"--{dest}"):
    """--K and --tree as every command takes them: each needs a drafter (drafting: one will run; drafter_flag:
    the flag that names it), and a tree fixes each round's drafts, so K beside it is refused, not dropped."""
    if not drafting and (K_given or tree is not None):
        raise ValueError(f"{named('K') if K_given else named('tree')} needs a drafter: add {drafter_flag} "
                         f"(a model name, or ngram)")
    if tree is not None and K_given:
        raise ValueError(f"{named('tree')} fixes each round's drafts: leave {named('K')} out (a tree round's K is "
                         f"the nodes it drafts)")


def check_tree_drafter(tree, drafter, named=lambda dest: f"--{dest}", lookup="prompt lookup"):
    """Prompt lookup (drafter "ngram") proposes earlier matches as a trie of the shape given: it grows no
    shapes for tree auto to choose among (the library would refuse it at the run, in the API's words)."""
    if tree == "auto" and drafter == "ngram":
        raise ValueError(f"{named('tree')} auto picks the shapes a draft model grows; {lookup} takes a fixed "
                         f"shape, e.g. {named('tree')} 3,1")


def command_error_line(error):
    """An exception as a command's one-line error: its first line, the fix named by the command's flag.

    >>> command_error_line(download.DownloadError(f"cannot reach x; {download.HINT}"))[:48]
    'cannot reach x; point --mirror (or $GPT2NP_MIRRO'
    """
    line = str(error).splitlines()[0] if str(error) else type(error).__name__
    for library, command in COMMAND_HINTS:
        line = line.replace(library, command)
    return "--" + line if line.startswith(LIBRARY_ARGUMENTS) else line


THREADS_HELP = "BLAS threads (default: 1 for models narrower than n_embd 512, else the BLAS default)"  # console, server


def target_help():  # compare's and latency's TARGET: named as main.py's --target_model_size
    return (f"target model, named as the gpt2np command (main.py) names one: 124M ... 1558M (gpt2 ... gpt2-xl), a "
            f"bundled name ({', '.join(loading.bundled_models()) or 'none'}), hf:owner/name[@revision] or a folder")


def add_loading_flags(p):
    """--models_dir, --mirror, --hf_endpoint: where every command finds or downloads its models."""
    p.add_argument("--models_dir", default="weights",
                   help="where OpenAI's release sizes (<dir>/<size>/) and Hub models (<dir>/<owner>/<name>/) "
                        "are downloaded to (default: %(default)s)")
    p.add_argument("--mirror", default=None,
                   help="base URL of a mirror of OpenAI's release (default: $GPT2NP_MIRROR, else OpenAI's own)")
    p.add_argument("--hf_endpoint", default=None,
                   help="Hugging Face Hub endpoint for hf: names (default: $HF_ENDPOINT, else "
                        "https://huggingface.co; $HF_TOKEN, if set, is sent as a bearer token)")


def run_command(main, *args, writes_stdout=True):
    """main(*args) as a command: bad input, missing files and HTTP errors are one line on stderr
    naming the command's flags (status 2), Ctrl-C is status 130, a closed pipe (`| head`) is 0. A closed
    stdout (`>&-`: Python's sys.stdout is None) is one line too, before any work, for a command that
    writes its text there (writes_stdout; the server writes only to stderr)."""
    if writes_stdout and sys.stdout is None:
        print("error: stdout is closed: the command writes its text there (send it to a file, or >/dev/null)",
              file=sys.stderr)  # nothing at all when stderr is closed too
        sys.exit(2)
    try:
        return main(*args)
    except KeyboardInterrupt:  # the text stopped mid-line: end the line, so the shell's prompt starts its own
        with contextlib.suppress(OSError, ValueError, AttributeError):  # AttributeError: stdout closed (None)
            sys.stdout.write("\n")
            sys.stdout.flush()
        sys.exit(130)
    except BrokenPipeError:  # the reader left: nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    except (ValueError, OSError, download.DownloadError) as e:
        print(f"error: {command_error_line(e)}", file=sys.stderr)
        sys.exit(2)


class TokenTexts:
    """Text of tokens as they stream in: UTF-8 decoded incrementally, so a character whose bytes
    are split across tokens (or across rounds) appears once it is complete."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def pieces(self, ids):  # -> one string per id ("" while a character is incomplete)
        return [self.decoder.decode(self.tokenizer.decode_bytes([i])) for i in ids]

    def flush(self):  # -> what an unfinished character at the very end becomes
        return self.decoder.decode(b"", final=True)

    def alone(self, token):  # -> one token's text, outside the stream (a rejected draft)
        return self.tokenizer.decode_bytes([token]).decode("utf-8", errors="replace")


def token_texts(tokenizer, ids):
    """The text each token contributes, decoding UTF-8 incrementally so split characters survive."""
    texts = TokenTexts(tokenizer)
    pieces = texts.pieces(ids)
    pieces[-1:] = [pieces[-1] + texts.flush()] if pieces else []
    return pieces


def coloured(pieces, provenance, colour=True):
    """Token texts joined, each wrapped in its provenance's ANSI colour when colour is on."""
    if not colour:
        return "".join(pieces)
    return "".join(PROVENANCE_COLOURS[p] + s + RESET if PROVENANCE_COLOURS[p] else s
                   for s, p in zip(pieces, provenance))


def rejected_draft(event):
    """The draft token a round's target rejected (a RoundEvent's drafts[n] after n acceptances), or
    None: no rejection, or the round was cut at an accepted end-of-text before it."""
    d = event.decisions
    return event.drafts[len(d) - 1] if d and not d[-1] and len(event.tokens) == len(d) else None


def provenance_spans(pieces, provenance, rejected=None):  # -> [(kind, text)], neighbours of one kind joined
    """One round's token texts as spans by provenance, the rejected draft's text (if any) before the
    target's replacement."""
    tagged = []
    for piece, kind in zip(pieces, provenance):
        if kind == "resample" and rejected is not None:
            tagged.append(("rejected", rejected))
        tagged.append((kind, piece))
    spans = []
    for kind, text in tagged:
        if spans and spans[-1][0] == kind:
            spans[-1] = (kind, spans[-1][1] + text)
        else:
            spans.append((kind, text))
    return spans


def marked(pieces, provenance, style, rejected=None):
    """One round's text with its provenance: style "colour" (ANSI; the rejected draft struck through),
    "markers" (plain text: [accepted: ...][rejected: ...][resampled: ...] spans) or "plain" (the text only).

    >>> marked(["a", "b", "c"], ["draft", "resample", "target"], "markers", rejected="x")
    '[accepted: a][rejected: x][resampled: b]c'
    """
    spans = provenance_spans(pieces, provenance, rejected)
    if style == "colour":
        return "".join(PROVENANCE_COLOURS[k] + t + RESET if PROVENANCE_COLOURS[k] else t for k, t in spans)
    if style == "markers":
        return "".join(f"[{PROVENANCE_MARKERS[k]}: {t}]" if k in PROVENANCE_MARKERS else t for k, t in spans)
    return "".join(t for k, t in spans if k != "rejected")


def provenance_legend(provenance, colour=True, markers=False, n_rejected=None, tree=False):
    """One line per kind of token, with its colour (or its plain-text marker) and how many tokens of
    that kind there were; n_rejected: how many rejected drafts were shown (None: none were); tree:
    the run drafted token trees (a bonus token follows a whole path, not K drafts)."""
    legend = []
    for kind, label in PROVENANCE_LABELS.items():
        if (kind == "target" and kind not in provenance) or (kind == "rejected" and n_rejected is None):
            continue  # only rounds without drafts make target tokens: no need to explain them otherwise
        label = TREE_BONUS_LABEL if tree and kind == "bonus" else label
        swatch = f"{PROVENANCE_COLOURS[kind]}{kind}{RESET}" if colour and PROVENANCE_COLOURS[kind] else kind
        swatch = f"[{PROVENANCE_MARKERS[kind]}: ...]" if markers and kind in PROVENANCE_MARKERS else swatch
        count = n_rejected if kind == "rejected" else provenance.count(kind)
        legend.append(f"  {swatch}: {label} ({count} tokens)")
    why = "not a terminal, NO_COLOR set, or TERM=dumb"
    off = f" (plain text: {why})" if markers else f" (colour off: {why})"
    return "legend" + ("" if colour else off) + ":\n" + "\n".join(legend)


def colour_by_provenance(tokenizer, ids, provenance, colour=True):
    """Text of ids with each token coloured by provenance (ANSI), followed by a legend with counts."""
    return coloured(token_texts(tokenizer, ids), provenance, colour) + "\n" + provenance_legend(provenance, colour)


def mean_std(values):
    values = np.asarray(values, dtype=float)
    return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else 0.0


def _fmt(x, spec, unit=""):
    """x formatted, with its unit; "n/a" alone (no unit) when the run could not measure it."""
    return "n/a" if x is None else format(x, spec) + unit


def is_tree_run(stats):
    """Whether a run drafted token trees (SpeculativeStats.tree: its drafter was a tree drafter)."""
    return bool(getattr(stats, "tree", False))


def K_usage(stats):
    """"fixed K=4" for a fixed K; "auto, K used 0:3 2:10 3:5 (K:rounds)" when a policy varied it. A tree
    run's K is the nodes a round drafted: "15 nodes/tree", or "nodes/tree 0:1 9:2 15:5 (nodes:rounds)"."""
    counts = stats.K_counts or {}
    if is_tree_run(stats):
        nodes = f"{stats.K} nodes/tree" if len(counts) <= 1 else \
            "nodes/tree " + " ".join(f"{K}:{n}" for K, n in counts.items()) + " (nodes:rounds)"
        return nodes if stats.policy == "fixed" else f"{stats.policy}, {nodes}"
    if stats.policy == "fixed":
        return f"fixed K={stats.K}"
    return f"{stats.policy}, K used {' '.join(f'{K}:{n}' for K, n in counts.items())} (K:rounds)"


def stats_summary(stats, measured_speedup=None):
    """One line: drafter, K policy, alpha_hat, tokens per target call, speedups."""
    line = (f"drafter {stats.drafter}, {K_usage(stats)}, alpha_hat {_fmt(stats.alpha_hat, '.2f')}, "
            f"{stats.tokens_per_target_call:.2f} tokens/target call, "
            f"predicted {_fmt(stats.predicted_speedup_refined, '.2f', 'x')}")
    return line + ("" if measured_speedup is None else f", measured {measured_speedup:.2f}x")


def _unmeasured(value, stats):
    """Why a cost is n/a: the run made no one-token target call to divide by, and was not asked to."""
    if value is not None or stats.target_timings.get(1) or stats.calibration_seconds:
        return ""
    return "   (no one-token target call in this run; calibrate=True times a few after it)"


def by_position(counts):
    """Per draft position i (the 1st, 2nd, ... draft of a round): accepted / proposed, with the counts.

    >>> by_position([(10, 10, 8), (10, 8, 6)])
    '1: 0.80 (8/10)  2: 0.60 (6/10)'
    """
    return "  ".join(f"{i}: {_fmt(a / n if n else None, '.2f')} ({a}/{n})" for i, (n, _, a) in enumerate(counts, 1))


def examined(stats):
    """alpha_empirical's fraction as counts, "136 / 181 examined, 45 rejected: ": a draft after a rejection is
    never examined, so the denominator is accepted + rejected, not the drafts proposed."""
    if stats.alpha_empirical is None:
        return ""
    return f"{stats.accepted} / {stats.accepted + stats.rejections} examined, {stats.rejections} rejected: "


def format_stats(stats, measured_speedup=None):
    """The acceptance statistics of a speculative run, one labelled line each."""
    s = stats
    lines = [
        "acceptance statistics",
        f"  drafter, K policy                        {s.drafter}, {K_usage(s)}",
        f"  rounds (target verification calls)      {s.rounds}",
        f"  draft tokens proposed / accepted         {s.drafted} / {s.accepted}",
        f"  alpha_hat = mean sum_x min(p, q)         {_fmt(s.alpha_hat, '.3f')}   (Leviathan Thm 3.5; "
        "expected acceptance per draft token)",
        f"  alpha_empirical = accepted / examined    {_fmt(s.alpha_empirical, '.3f')}   "
        f"({examined(s)}what this run saw)",
        f"  accepted by draft position (i: rate)     {by_position(s.by_position) or 'no drafts'}",
        f"  tokens per target call                   {_fmt(s.tokens_per_target_call, '.2f')}",
        f"  draft calls, time                        {s.draft_calls}, {s.draft_seconds:.3f} s",
        f"  target calls, time                       {s.target_calls}, {s.target_seconds:.3f} s",
        *([f"  cost curve's shape read before the run   {s.probe_seconds:.3f} s   (auto plans v(M) with it)"]
          if s.probe_seconds else []),
        *([f"  prompt read before the run               {s.prompt_positions} positions, mean beta "
           f"{s.prompt_overlap:.3f}, {s.prompt_seconds:.3f} s   (auto's first belief about alpha)"]
          if s.prompt_positions else []),
        f"  c = drafter / target time per token      {_fmt(s.c, '.3f')}{_unmeasured(s.c, s)}",
        f"  v = target (K+1)-token / 1-token call    {_fmt(s.v, '.3f')}{_unmeasured(s.v, s)}",
        f"  predicted speedup, Thm 3.8 (v = 1)       {_fmt(s.predicted_speedup, '.2f', 'x')}",
        f"  predicted speedup with measured v        {_fmt(s.predicted_speedup_refined, '.2f', 'x')}",
    ]
    if measured_speedup is not None:
        lines.append(f"  measured speedup (wall clock)            {_fmt(measured_speedup, '.2f', 'x')}")
    return "\n".join(lines)


def seed_error(seed, flag="--seed"):  # -> a negative seed's one-line refusal, or None
    """Every command's --seed check, before any work: np.random.default_rng refuses a negative seed only
    when a run starts, in NumPy's words and a traceback. flag: the flag as the user spelled it.

    >>> seed_error(-1), seed_error(0)
    ('--seed must be a non-negative integer, got -1', None)
    """
    return f"{flag} must be a non-negative integer, got {seed}" if seed < 0 else None


def check_json_path(path, example="out.json"):
    """A command's --json path, before any work: a folder, a missing folder or one nothing can be written in
    is a one-line ValueError naming --json. The folder is tried by making and removing a temporary file
    (os.access says yes to root, even on /proc). A path that is no plain file (/dev/stdout, a pipe) is
    written as it is, so only its permission is checked."""
    path = Path(path)
    if path.is_dir() or not path.name:
        raise ValueError(f"--json {path} is a folder: name a file in it, e.g. {path / example}")
    if path.exists() and not path.is_file():
        if not os.access(path, os.W_OK):
            raise ValueError(f"--json {path}: cannot write to it (permission denied)")
        return
    folder = path.resolve().parent
    if not folder.is_dir():
        raise ValueError(f"--json {path}: {folder} is not a folder" if folder.exists() else
                         f"--json {path}: the folder {folder} does not exist")
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise ValueError(f"--json {path}: cannot write in the folder {folder} ({e.strerror or e})") from None
    os.close(fd)
    os.unlink(probe)


def write_atomically(path, text):
    """text into path through a temporary name in the same folder, then a rename: a reader never sees
    half a file, and a failed write leaves path as it was (and no temporary file). A path that is no
    plain file (/dev/stdout, a pipe) is written as it is: renaming onto it would replace it."""
    path = Path(path)
    if path.exists() and not path.is_file():
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return
    path = path.resolve()  # a link's file is replaced, not the link
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # mkstemp's 0600 -> what open() would have made
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


@contextlib.contextmanager
def drafter_errors(none=True):
    """Around loading a drafter: an unknown name is said again with the drafter's own choices (ngram, and
    none where the command runs the target alone: none=True) among the known names, and its did-you-mean
    among them too; any other error as it is."""
    try:
        yield
    except loading.UnknownModelError as error:
        raise loading.unknown_model(error.name, drafter=True, none=none) from None


def write_flag_file(flag, path, text):
    """report.write_atomically for a command's flag (--json PATH): a write that fails (a full disk, a folder
    gone since check_json_path) is a one-line ValueError naming the flag and the path as typed."""
    try:
        write_atomically(path, text)
    except OSError as e:
        raise ValueError(f"{flag} {path}: {e.strerror or command_error_line(e)}") from e


NO_DRAFTER = "none"  # --draft_model_size none: no drafter, the target alone (main.py, the console, the server)
BUNDLED_TOKENS, OTHER_TOKENS = 200, 40  # new tokens when none are asked for: the bundled pair's demo, a larger target's


def chosen_drafter(args, default_draft):  # -> the drafter's name, or None for target-only runs
    """--draft_model_size as given, default_draft (the bundled draft) with the default target, None for
    'none' or for another target left without one (main.py's and the console's rule)."""
    name = args.draft_model_size or (default_draft if args.target_model_size is None else None)
    return None if name == NO_DRAFTER else name


def default_n_tokens(args):
    """BUNDLED_TOKENS where the target is a bundled model, named or the default; else OTHER_TOKENS."""
    bundled = args.target_model_size is None or args.target_model_size in loading.bundled_models()
    return BUNDLED_TOKENS if bundled else OTHER_TOKENS


def check_tokenizer(name, models_dir, use, said=None):
    """A one-line ValueError where load_model(name, models_dir) would give a model without a tokenizer (only
    random:<size> can: loading.has_tokenizer), said before its weights are built (random:1558M's take about
    30 s). use: what the command does with text ("to encode the prompt with"); said: how the line names the
    model (the name, unless given: the server's "--target_model_size random:124M")."""
    if not loading.has_tokenizer(name, models_dir):
        raise ValueError(f"{said or name} has no tokenizer {use} (random weights of GPT-2's vocabulary find OpenAI's "
                         f"encoder.json + vocab.bpe in a folder of --models_dir {models_dir}, where any downloaded "
                         f"release size puts them; a byte-level vocabulary is n_vocab 257)")


def check_model_names(args, named=lambda dest: f"--{dest}", dests=("target_model_size", "draft_model_size")):
    """--target_model_size / --draft_model_size given as "" (or blanks): a one-line ValueError, since an empty
    name would fall back to a default or read the current folder. named: how the command spells each flag;
    dests: the arguments that name models (compare's and latency's positionals: target, draft as TARGET, DRAFT)."""
    for dest in dests:
        value = getattr(args, dest, None)
        if value is not None and not value.strip():  # "" is not the default (None)
            leave = ", or leave the flag out" if named(dest).startswith("-") else ""
            raise ValueError(f"{named(dest)} is empty: name a model (a size, a bundled name or a folder){leave}")
