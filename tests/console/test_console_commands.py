"""The console's '/' commands, `:cache off` for speculative runs, `:compare` as its own setting, K 0 in
the trace for rounds without drafts, and the loading flags every command shares.

Scripts go through a real pipe (`printf script | python -m gpt2np.console`) on the bundled pair;
what the console prints is compared with what the package gives for the same settings.
"""
import re
import socket
import subprocess
import sys

import numpy as np
import pytest

import gpt2np
from conftest import REPO
from gpt2np.console.commands import CommandError, Settings, parse_command
from gpt2np.console.display import trace_lines
from gpt2np.console.repl import main
from gpt2np.console.runs import open_stream
from gpt2np.console.slash import colon_line
from test_console import PROMPT, run_console, sections, text_of

# romsto/Speculative-Decoding's console commands, each beside the ':' command with its meaning
SLASH = [("/quit", ":quit"), ("/debug", ":trace"), ("/debug off", ":trace off"), ("/speculative off", ":speculative off"),
         ("/target", ":target"), ("/target on", ":target on"), ("/drafter", ":draft"), ("/drafter on", ":draft on"),
         ("/drafter ngram", ":drafter ngram"), ("/cache off", ":cache off"), ("/length 40", ":tokens 40"),
         ("/gamma 2", ":K 2"), ("/clear", ":clear"), ("/processor top_k 5 0.8", ":sampling top_k 5 0.8"),
         ("/processor greedy", ":sampling greedy"), ("/help", ":help"), ("/K auto 6", ":K auto 6")]
NAMED = {"quit", "debug", "speculative", "target", "drafter", "cache", "length", "gamma", "clear", "processor"}


@pytest.fixture(scope="module")
def pair():
    return gpt2np.load_model("shakespeare-2.6M"), gpt2np.load_model("shakespeare-260K")


@pytest.mark.parametrize("slash, colon", SLASH)
def test_each_slash_command_does_what_its_colon_command_does(slash, colon):
    settings = Settings(drafter="shakespeare-260K", temperature=0.5)
    assert colon_line(slash) == colon
    assert parse_command(colon_line(slash), settings) == parse_command(colon, settings)


def test_the_table_covers_every_named_slash_command():
    assert {slash[1:].split()[0] for slash, _ in SLASH} >= NAMED


@pytest.mark.parametrize("line", ["/chat", "/usr/bin/env python", "/", "/gamma4"])
def test_a_slash_line_that_names_no_command_is_an_error(line):
    with pytest.raises(CommandError, match="type /help for the list"):
        colon_line(line)


def test_slash_script_answers_and_generates_as_the_colon_script_does():
    steps = ["/gamma 2", "/length 12", "/debug on", "/target on", "/processor top_k 5 0.8", "/seed 3", "/drafter"]
    slash = run_console("\n".join(steps) + f"\n{PROMPT}\n/quit\nnever run\n")
    colon = run_console("\n".join(colon_line(s) for s in steps) + f"\n{PROMPT}\n:quit\nnever run\n")
    assert slash.returncode == colon.returncode == 0 and slash.stderr == colon.stderr == "", slash.stderr
    n = len(steps)
    assert slash.stdout.splitlines()[:n] == colon.stdout.splitlines()[:n] == [
        "K: 2", "tokens: 12", "trace: on", "target: on",
        "temperature: 0.8, top_k: 5, sampling: top_k 5 T=0.8", "seed: 3", "draft: on"]
    assert sections(slash.stdout) == sections(colon.stdout)
    assert set(sections(slash.stdout)) == {"target-only", "draft-only", "speculative"}
    assert "never run" not in slash.stdout


def test_unknown_slash_lines_say_so_and_generate_nothing_and_double_slash_is_a_prompt(pair):
    out = run_console(":tokens 8\n/chat\n/usr/bin/env python\n//usr\n")
    assert out.returncode == 0
    assert out.stderr.splitlines() == ["error: unknown command /chat: type /help for the list",
                                       "error: unknown command /usr/bin/env: type /help for the list"]
    target = pair[0]
    want = text_of(target, gpt2np.generate(target, target.tokenizer.encode("/usr"), 8, temperature=0), "/usr")
    assert sections(out.stdout) == {"speculative": [want]}  # only '//usr' was generated from


def test_cache_off_runs_speculative_decoding_again_recomputing_every_round(pair):
    target, _ = pair
    out = run_console(f":tokens 24\n:cache off\n{PROMPT}\n")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    want = text_of(target, gpt2np.generate(target, target.tokenizer.encode(PROMPT), 24, temperature=0))
    assert sections(out.stdout) == {"speculative": [want], "speculative, no KV cache": [want]}
    assert re.search(r"^speculative, no KV cache: 24 tokens in [\d.]+ s, [\d.]+ tokens/s \| drafter shakespeare-260K"
                     r".*; the KV cache is [\d.]+x faster$", out.stdout, flags=re.M), out.stdout


class Counting:
    """A model that records, for every forward call, how many tokens its cache held and the ids fed, and
    the positions of every cache it was asked for (it sizes caches as a GPT2 does)."""
    sized_caches = True

    def __init__(self, model):
        self.model, self.calls, self.cache_sizes = model, [], []

    def __getattr__(self, name):
        if name == "model":
            raise AttributeError(name)
        return getattr(self.model, name)

    def new_cache(self, n_ctx=None):
        self.cache_sizes.append(n_ctx)
        return self.model.new_cache(n_ctx)

    def forward(self, ids, cache, n_logits=1):
        self.calls.append((len(cache), [int(t) for t in ids]))
        return self.model.forward(ids, cache, n_logits)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_without_the_cache_every_call_recomputes_the_whole_context_and_the_tokens_are_the_same(pair, temperature):
    target, draft = (Counting(m) for m in pair)
    settings = Settings(temperature=temperature, seed=7, n_tokens=20, K=3, drafter="d")
    ids = pair[0].tokenizer.encode(PROMPT)
    cached = open_stream("speculative", pair[0], gpt2np.ModelDrafter(pair[1]), ids, settings).run()
    stream = open_stream("speculative", target, gpt2np.ModelDrafter(draft), ids, settings, use_cache=False)
    recomputed = stream.run()
    assert recomputed.tokens == cached.tokens and recomputed.provenance == cached.provenance
    context = ids + recomputed.tokens
    assert len(target.calls) >= recomputed.stats.rounds > 1
    for held, fed in target.calls:  # each call: the whole context so far, then the round's drafts (<= K)
        agreed = len(fed) - settings.K
        assert held == 0 and len(fed) > len(ids) and fed[:agreed] == context[:agreed], (held, len(fed))
    assert len(draft.calls) == recomputed.stats.drafted > 0  # one full pass per drafted token
    assert all(held == 0 and fed[:len(ids)] == ids for held, fed in draft.calls)
    for model in (target, draft):  # every fresh cache holds the positions its call feeds, not the whole context
        assert model.cache_sizes == [len(fed) for _, fed in model.calls], (model.cache_sizes, pair[0].n_ctx)


def test_target_on_does_not_turn_compare_on_and_compare_runs_both_whatever_the_switches():
    out = run_console(f":tokens 10\n:target on\n:help\n:target off\n:compare on\n:speculative off\n:target off\n{PROMPT}\n")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    lines = out.stdout.splitlines()
    assert lines[1] == "target: on"  # nothing else changed: no "compare: on"
    help_compare = next(line for line in lines if line.startswith("  :compare"))
    assert re.search(r"\soff\s", help_compare), help_compare
    after_help = lines[lines.index(next(l for l in lines if l.startswith("  :quit"))) + 1:]
    assert after_help[:4] == ["target: off", "compare: on",
                              "speculative: off (speculative still runs: compare is on; :compare off to stop it)",
                              "target: already off (target-only still runs: compare is on; :compare off to stop it)"]
    assert set(sections(out.stdout)) == {"target-only", "speculative"}


def test_trace_says_prompt_lookup_found_no_match_for_rounds_where_it_drafted_nothing(pair):
    target, _ = pair
    prompt = "ROMEO: ROMEO"
    out = run_console(f":drafter ngram\n:trace on\n:tokens 40\n{prompt}\n")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    trace = out.stdout.split("trace (p = target")[1].split("\nspeculative: ")[0]
    heads = re.findall(r"^  round \d+ \(tokens [\d-]+\): (.*)$", trace, flags=re.M)
    records = gpt2np.speculative_generate(target, gpt2np.NgramDrafter(n_max=3), target.tokenizer.encode(prompt), 40,
                                          K=4, temperature=0, trace=True).trace
    assert len(heads) == len(records)
    assert any(not r.drafts for r in records)  # rounds that asked for drafts and got none (a fixed K of 4)
    assert all(r.K == len(r.drafts) for r in records), [(r.K, len(r.drafts)) for r in records]  # the stream says K 0
    for head, record in zip(heads, records):
        if not record.drafts:  # a fixed K=4 asked for drafts: not "K=0", which reads as a policy's choice
            assert head.startswith("no drafts (prompt lookup found no match)"), head
        else:
            assert head.startswith(f"K={len(record.drafts)}"), (head, record.drafts)


def test_trace_line_of_an_empty_round_says_K_0():
    tokenizer = gpt2np.load_model("shakespeare-260K").tokenizer
    event = gpt2np.RoundEvent(tokens=tokenizer.encode("A"), provenance=["target"], K=0, n_emitted=3)
    assert trace_lines(event, 3, tokenizer) == ["  round 3 (tokens 3-3): no drafts (K=0), target token 'A'"]


def test_help_names_hub_names_and_the_loading_flags():
    out = subprocess.run([sys.executable, "-m", "gpt2np.console", "--help"], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert out.returncode == 0
    for word in ("hf:owner/name", "--hf_endpoint", "--mirror", "--models_dir"):
        assert word in out.stdout, word


def closed_port():
    """A local port nothing listens on: connections are refused at once (no network involved)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("model, flag", [("124M", "--mirror"), ("hf:someone/gpt2-small", "--hf_endpoint")])
def test_a_failed_download_names_flags_the_console_accepts(capsys, tmp_path, model, flag):
    url = f"http://127.0.0.1:{closed_port()}"
    assert main(["--target_model_size", model, "--models_dir", str(tmp_path), flag, url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert f"point {flag}" in err, err
    help_text = subprocess.run([sys.executable, "-m", "gpt2np.console", "--help"], capture_output=True, text=True,
                               cwd=REPO, timeout=120).stdout
    for named in re.findall(r"--\w+", err):
        assert named in help_text, (named, err)


def test_the_console_passes_hf_endpoint_and_models_dir_to_the_loader(capsys, tmp_path, monkeypatch):
    """An hf: name is fetched from --hf_endpoint (refused here: no server), and a failed fetch leaves nothing in
    --models_dir; the loader is handed --models_dir and the endpoint as given (recorded by a stand-in)."""
    url = f"http://127.0.0.1:{closed_port()}"
    assert main(["--target_model_size", "hf:someone/gpt2-small", "--models_dir", str(tmp_path),
                 "--hf_endpoint", url]) == 2
    assert url in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing half-made: the folders the attempt created are gone
    calls = []

    def loader(name, models_dir, **sources):
        calls.append((name, models_dir, sources))
        raise OSError("stand-in")
    monkeypatch.setattr(gpt2np, "load_model", loader)
    assert main(["--target_model_size", "hf:someone/gpt2-small", "--models_dir", str(tmp_path),
                 "--hf_endpoint", url]) == 2
    assert calls == [("hf:someone/gpt2-small", str(tmp_path), {"base_url": None, "hf_endpoint": url})], calls


def test_seeded_speculative_runs_repeat_with_and_without_the_cache(pair):
    """Sampling: the no-cache run draws from its own default_rng(seed), so it writes the same text."""
    target, draft = pair
    out = run_console(f":sampling plain 0.9\n:seed 11\n:tokens 20\n:cache off\n{PROMPT}\n")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    ids = target.tokenizer.encode(PROMPT)
    want = text_of(target, gpt2np.speculative_generate(target, draft, ids, 20, K=4, temperature=0.9,
                                                       rng=np.random.default_rng(11)).tokens)
    assert sections(out.stdout) == {"speculative": [want], "speculative, no KV cache": [want]}


def test_tree_command_and_flag_draft_token_trees_and_keep_the_greedy_text(pair):
    """:tree 3,2 and --tree auto (issue 28, item 6): the target's greedy text, the tree named in the
    run's header; bad shapes and a tree without the KV cache are one-line errors, the latter refused when set
    (either order), not at every prompt after it (which then ran nothing at all)."""
    target, _ = pair
    want = text_of(target, gpt2np.generate(target, target.tokenizer.encode(PROMPT), 24, temperature=0))
    out = run_console(f":tokens 24\n:tree 3,2\n{PROMPT}\n:tree x\n:cache off\n{PROMPT}\n:tree off\n:cache off\n"
                      f":tree 3,2\n:help\n")
    assert out.returncode == 0 and sections(out.stdout)["speculative"] == [want, want], out.stdout  # cache kept on
    assert "tree: 3,2" in out.stdout and "tree 3,2" in out.stdout.split("=== speculative")[1].split("\n")[0]
    assert out.stderr.splitlines() == [
        "error: tree must be children per depth, comma-separated integers >= 1 (e.g. 3,2,1), auto or off, got 'x'",
        "error: :cache off with a tree: a token tree runs with the KV cache only (its rows are kept per path): "
        ":tree off first",
        "error: :tree with :cache off: a token tree runs with the KV cache only (its rows are kept per path): "
        ":cache on first"]
    assert re.search(r":tree W1,W2,...\|auto\|off\s+off\s+draft a token tree", out.stdout), out.stdout
    auto = run_console(f"{PROMPT}\n", "--tree", "auto", "--n_tokens_to_generate", "24")
    assert auto.returncode == 0 and sections(auto.stdout) == {"speculative": [want]}, auto.stderr
    assert "tree auto" in auto.stdout
    bad = run_console("", "--tree", "3,0")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "tree must be children per depth" in bad.stderr


def test_without_the_cache_auto_reads_no_cost_shape_a_block_s_curve_is_not_a_recomputing_call_s(pair, monkeypatch):
    """Every `:cache off` call costs a prefill of the history whatever its M, so the model's block-by-rows shape
    would misprice it: Recomputing offers none, and auto plans on a line; with the cache, auto reads the shape."""
    import gpt2np.model.forward as forward
    reads, real = [], forward.row_cost_shape
    monkeypatch.setattr(forward, "row_cost_shape", lambda *a: reads.append(a[3]) or real(*a))
    target = gpt2np.load_model("shakespeare-2.6M")  # its own record of shapes read
    settings = Settings(temperature=0.0, n_tokens=200, K="auto", drafter="d")
    ids = target.tokenizer.encode(PROMPT)
    off = open_stream("speculative", target, gpt2np.ModelDrafter(pair[1]), ids, settings, use_cache=False).run()
    assert reads == [] and off.stats.probe_seconds == 0.0, reads
    on = open_stream("speculative", target, gpt2np.ModelDrafter(pair[1]), ids, settings).run()
    assert reads == [9] and on.stats.probe_seconds > 0 and on.tokens == off.tokens, reads


# ---- an audit of the console as a user drives it (session 62) ------------------------------------------------

def test_a_drafter_switched_back_in_drafts_again_and_ctrl_c_while_loading_keeps_the_console(pair):
    """After :drafter none, :drafter NAME left speculative decoding off with nothing said (only target-only ran);
    Ctrl-C while a drafter loaded (a slow download) quit the whole console. Now the drafter comes back drafting,
    a load says it is loading, and Ctrl-C there keeps the console and its drafter."""
    import io
    from gpt2np.console.repl import Console
    target, draft = pair
    calls = []

    def load_drafter(name):  # the second load is interrupted, as Ctrl-C during a download
        calls.append(name)
        if name == "slow":
            raise KeyboardInterrupt
        return gpt2np.ModelDrafter(draft)
    out, err = io.StringIO(), io.StringIO()
    console = Console(target, Settings(drafter=None, speculative=False), load_drafter, out=out, err=err)
    console.switch_drafter("shakespeare-260K")
    assert console.settings.speculative and console.settings.drafter == "shakespeare-260K"
    console.switch_drafter("slow")
    assert console.settings.drafter == "shakespeare-260K" and calls == ["shakespeare-260K", "slow"]
    assert out.getvalue().splitlines() == ["loading drafter shakespeare-260K ... (Ctrl-C: keep none)",
                                           "drafter: shakespeare-260K (speculative on)",
                                           "loading drafter slow ... (Ctrl-C: keep shakespeare-260K)"]
    assert err.getvalue() == "error: interrupted: drafter 'slow' not loaded; the drafter is still shakespeare-260K\n"
    out = run_console(f":drafter none\n:drafter shakespeare-260K\n:tokens 5\n{PROMPT}\n")
    assert out.returncode == 0 and "speculative" in sections(out.stdout), out.stdout


def test_policy_names_in_any_case_and_a_slower_cache_said_so(pair):
    """:K Auto was refused where :tree AUTO and :trace ON are taken; one token without the cache printed "the
    KV cache is 0.71x faster"."""
    assert parse_command(":K Auto 6", Settings(drafter="ngram")).settings.K == "auto"
    out = run_console(f":tokens 1\n:speculative off\n:target on\n:cache off\n{PROMPT}\n")
    said = re.search(r"the KV cache is ([\d.]+)x (faster|slower)$", out.stdout, re.M)
    assert out.returncode == 0 and said and float(said[1]) >= 1, out.stdout
    assert re.search(r"^target-only: 1 token in ", out.stdout, re.M), out.stdout  # not "1 tokens"


def test_a_prompt_is_encoded_as_typed_spaces_kept(pair):
    """"ROMEO: " was stripped to "ROMEO:", which continues otherwise on the byte-level vocabulary than main.py's
    --prompt "ROMEO: " does; spaces are kept now (a line of spaces alone is still nothing)."""
    target, _ = pair
    for prompt in ("ROMEO: ", " ROMEO:"):
        want = text_of(target, gpt2np.generate(target, target.tokenizer.encode(prompt), 6, temperature=0), prompt)
        out = run_console(f"   \n{prompt}\n", "--n_tokens_to_generate", "6", "--draft_model_size", "none")
        assert out.returncode == 0 and sections(out.stdout)["target-only"] == [want], (prompt, out.stdout)


# ---- drafter names, folders and commands as typed (session 63) --------------------------------------------------

def test_ngram_and_none_are_drafters_in_any_case_as_K_auto_is():
    """:drafter NGRAM and :drafter None were taken as model names to load ('unknown model')."""
    from gpt2np.console.slash import parse_typed
    for line, want in [(":drafter NGRAM", "ngram"), (":drafter None", "none"), ("/drafter Ngram", "ngram")]:
        assert parse_typed(line, Settings(drafter="d")).argument == want, line
    with pytest.raises(CommandError, match="prompt lookup takes a fixed shape"):
        parse_command(":drafter NGRAM", Settings(drafter="d", tree="auto"))


def test_a_drafter_folder_typed_with_a_tilde_is_in_the_home_folder(tmp_path):
    """:drafter ~/draft looked for a folder named '~' in the current folder; a shell expands it, so now does :drafter."""
    import os
    import shutil
    shutil.copytree(REPO / "gpt2np" / "bundled" / "shakespeare-260K", tmp_path / "draft",
                    ignore=shutil.ignore_patterns(".*"))
    out = run_console(f":drafter ~/draft\n:tokens 5\n{PROMPT}\n", env={**os.environ, "HOME": str(tmp_path)})
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert f"drafter: {tmp_path / 'draft'}" in out.stdout and "speculative" in sections(out.stdout), out.stdout


@pytest.mark.parametrize("line, settings, message", [
    ("/gamma 0", Settings(), "/gamma must be an integer >= 1, 'heuristic' or 'auto', got 0"),
    ("/K", Settings(), "usage: /K N | heuristic [K_max] | auto [K_max]"),
    ("/K 3 5", Settings(), "K_max bounds /K heuristic or /K auto only (a fixed K is its own bound)"),
    (":k x", Settings(), ":k must be an integer >= 1, 'heuristic' or 'auto', got 'x'"),
    ("/length", Settings(), "usage: /length VALUE"),
    ("/processor", Settings(), "usage: /processor greedy | plain [T] | top_k K [T] | nucleus P [T]"),
    ("/debug maybe", Settings(), "/debug takes on or off (or nothing, to toggle), got 'maybe'"),
    ("/tree 3,1", Settings(drafter="d", cache=False), "/tree with :cache off: a token tree runs with the KV cache"),
])
def test_a_command_s_error_names_it_as_typed(line, settings, message):
    """'/K' was answered 'usage: :K ...', '/gamma 0' with ':K must be ...': the ':' command it means."""
    from gpt2np.console.slash import parse_typed
    with pytest.raises(CommandError) as error:
        parse_typed(line, settings)
    assert str(error.value).startswith(message), str(error.value)


def test_tokens_past_the_context_name_the_command_as_typed(pair):
    import io
    from gpt2np.console.repl import Console
    out, err = io.StringIO(), io.StringIO()
    console = Console(pair[0], Settings(), lambda name: None, out=out, err=err)
    assert console.handle("/length 300") and console.handle(":n 300") and console.settings.n_tokens == 200
    assert err.getvalue().splitlines() == [f"error: {typed} 300: at most 255 new tokens fit the target's context of "
                                           "256 tokens (a prompt takes at least one)" for typed in ("/length", ":n")]
