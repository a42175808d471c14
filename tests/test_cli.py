"""main.py end to end, as a user runs it: real subprocesses, real exit codes, real stderr."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import FIXTURES, REPO, copy_fixture


@pytest.fixture(scope="module")
def release_dirs(bpe_dir, tmp_path_factory):
    """The two tiny fixtures as complete release folders (model files + OpenAI's tokenizer files)."""
    folders = {}
    for name in ("gpt2-tiny-a", "gpt2-tiny-b"):
        folder = tmp_path_factory.mktemp("release") / name
        copy_fixture(FIXTURES / name, folder)
        for f in ("encoder.json", "vocab.bpe"):
            shutil.copy(bpe_dir / f, folder / f)
        folders[name] = str(folder)
    return folders


def run_main(*args, env=None):
    return subprocess.run([sys.executable, "main.py", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env=env)


def test_one_model_generates_text(release_dirs):
    out = run_main("--target_model_size", release_dirs["gpt2-tiny-a"], "--prompt", "Hello",
                   "--n_tokens_to_generate", "8", "--seed", "0")
    assert out.returncode == 0, out.stderr
    assert "tokens/s" in out.stdout and "Hello" in out.stdout
    assert "speculative" not in out.stdout  # no draft: plain generation only


def unmark(text):
    """-v's plain-text provenance taken out again: rejected drafts dropped, the other spans unwrapped."""
    text = re.sub(r"\[rejected: (.*?)\]", "", text, flags=re.S)
    return re.sub(r"\[(?:accepted|resampled|bonus): (.*?)\]", r"\1", text, flags=re.S)


@pytest.fixture(scope="module")
def verbose_run(release_dirs):
    """The tiny pair at temperature 0 (main.py's default), -v into a pipe: the CompletedProcess."""
    return run_main("--draft_model_size", release_dirs["gpt2-tiny-a"], "--target_model_size",
                    release_dirs["gpt2-tiny-b"], "--n_tokens_to_generate", "20", "--K", "4",
                    "--temperature", "0", "-v")


def test_speculative_at_temperature_zero_prints_identical_texts_stats_and_legend(verbose_run):
    out = verbose_run
    assert out.returncode == 0, out.stderr
    sections = out.stdout.split("=== ")  # header line, the text as it streamed, then the time
    ar_text = sections[1].split("\n", 1)[1].split("\ntime:")[0]
    sd_text = sections[2].split("\n", 1)[1].split("\nlegend")[0]
    assert "[accepted: " in sd_text  # -v into a pipe: the provenance as text (test_cli_compat.py)
    assert ar_text.strip() == unmark(sd_text).strip()
    for expected in ("legend", "accepted draft token", "alpha_hat", "predicted speedup", "measured speedup"):
        assert expected in out.stdout


def test_verbose_colours_tokens_only_on_a_terminal(verbose_run):
    """Captured output is not a TTY: no ANSI escapes, even with -v (test_cli_compat.py: on a terminal, escapes)."""
    out = verbose_run
    assert out.returncode == 0, out.stderr
    assert "\033[" not in out.stdout


@pytest.mark.parametrize("args, message", [
    (["--target_model_size", "999M"], "unknown model"),
    (["--temperature", "-1"], "temperature"),
    (["--top_p", "0"], "top_p"),
    (["--top_p", "1.5"], "top_p"),
    (["--top_k", "0"], "top_k"),
    (["--n_tokens_to_generate", "0"], "n_tokens_to_generate"),
    (["--K", "0"], "K"),
    (["--K", "abc"], "invalid K 'abc'"),
    (["--K", "sometimes"], "heuristic"),
    (["--K", "auto", "--K_max", "0"], "K_max"),
    (["--draft_model_size", "ngram", "--ngram_max", "0"], "ngram_max"),
    (["--K", "3", "--K_max", "5"], "K_max bounds"),
    (["--ngram_max", "2"], "ngram only"),
    (["--target_model_size", "shakespeare-2.6M", "--K", "2"], "--K needs a drafter"),
    (["--no_such_flag"], "unrecognized"),
    # each named as typed, not in the library's words (temperature, top_k, n_tokens)
    (["--temperature", "-1"], "--temperature must be a finite number >= 0 (0 means greedy), got -1.0"),
    (["--temperature", "nan"], "--temperature must be a finite number >= 0"),
    (["--top_k", "0"], "--top_k must be at least 1 (leave it out to keep every token), got 0"),
    (["--top_p", "2"], "--top_p must be in (0, 1] (1, or leaving it out, keeps every token), got 2.0"),
    (["--n_tokens_to_generate", "100000"], "the prompt (47 tokens) + --n_tokens_to_generate (100000) = 100047 "
                                           "exceeds the context of 256 tokens; shorten --prompt or ask for fewer"),
])
def test_bad_input_gives_one_line_and_exit_status_2(args, message, main_here):
    out = main_here(*args)
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("name", ["random:124M", "random:tiny"])  # GPT-2's vocabulary without its files; 64 tokens
def test_random_weights_without_a_tokenizer_are_refused_before_their_init(name, tmp_path, no_random_init, main_here):
    """main.py encodes the prompt: a model without a tokenizer is one line and status 2, said before the
    weights are built (random:1558M's take about 30 s)."""
    out = main_here("--target_model_size", name, "--models_dir", str(tmp_path))
    assert out.returncode == 2 and out.stdout == "" and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert f"error: {name} has no tokenizer to encode the prompt with" in out.stderr, out.stderr

def test_a_random_draft_of_another_vocabulary_is_refused_before_its_init(no_random_init, main_here):
    """--draft_model_size random:1558M beside the bundled target (257 tokens) built the draft's weights (about
    30 s) before saying the vocabularies differ: now before (load_drafter's target)."""
    out = main_here("--draft_model_size", "random:1558M")
    assert (out.returncode, out.stdout, out.stderr) == (2, "", "error: draft and target must share a vocabulary: n_vocab 50257 vs 257 (draft vs target)\n"), out


def test_python_dash_m_gpt2np_is_main_py_for_an_installed_package():
    """An installed gpt2np has no main.py: `python -m gpt2np` runs the same command, its usage and errors named
    that way."""
    def run(*args):
        return subprocess.run([sys.executable, "-m", "gpt2np", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=300)
    same = ["--n_tokens_to_generate", "4", "--num_runs", "1"]
    here, real = run(*same), run_main(*same)
    assert here.returncode == 0 and here.stdout.splitlines()[0] == real.stdout.splitlines()[0], (here, real)
    assert "speculative" in here.stdout and "Traceback" not in here.stderr, here
    bad = run("--bogus")
    assert (bad.returncode, bad.stdout) == (2, "") and bad.stderr.startswith("python -m gpt2np: error: unrecognized "
                                                                             "arguments: --bogus"), bad.stderr


def test_a_refusal_in_process_is_what_the_process_writes(main_here):
    """main_here's refusals are `python main.py`'s, byte for byte: argparse's usage error and a check's."""
    for args in (["--no_such_flag"], ["--K", "3", "--K_max", "5"]):
        real, here = run_main(*args), main_here(*args)
        assert (here.returncode, here.stdout, here.stderr) == (real.returncode, real.stdout, real.stderr) and \
            real.returncode == 2 and real.stderr, (here, real)


@pytest.mark.parametrize("args, message", [
    (["--seed", "-1"], "--seed must be a non-negative integer, got -1"),
    (["--target_model_size", ""], "--target_model_size is empty"),
    (["--target_model_size", " "], "--target_model_size is empty"),
    (["--draft_model_size", ""], "--draft_model_size is empty"),
])
def test_bad_seed_and_empty_model_names_are_refused_before_loading(args, message, tmp_path, main_here):
    """Were anything loaded first, 124M from an unreachable mirror would fail with 'cannot reach'."""
    base = ["--target_model_size", "124M", "--models_dir", str(tmp_path), "--mirror", "http://127.0.0.1:9"]
    out = main_here(*base, *args)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and out.stdout == ""
    assert not list(tmp_path.iterdir())


def test_every_command_s_seed_refusal_is_worded_in_one_place():
    """Seven commands (main.py, the console, compare, latency, three tools) each spelled it out; now report.seed_error
    does, and they say its words (their tests assert them)."""
    sources = [*(REPO / "gpt2np").rglob("*.py"), *(REPO / "tools").glob("*.py"), REPO / "main.py"]
    worded = [p.relative_to(REPO).as_posix() for p in sources if "must be a non-negative integer, got" in p.read_text()]
    assert worded == ["gpt2np/report.py"], worded


def test_prompt_too_long_for_the_context_is_refused(release_dirs):
    out = run_main("--target_model_size", release_dirs["gpt2-tiny-a"], "--prompt", "word " * 60,
                   "--n_tokens_to_generate", "10")
    assert out.returncode == 2 and "exceeds the context of 64" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and out.stdout == ""  # refused before any work


def test_empty_prompt_samples_unconditionally_from_end_of_text():
    out = run_main("--prompt", "", "--n_tokens_to_generate", "20")
    assert out.returncode == 0, out.stderr
    assert "prompt: empty, conditioned on <|endoftext|>," in out.stdout  # not "1 tokens" of a prompt never typed


def test_unreachable_mirror_is_a_one_line_error(tmp_path):
    out = run_main("--target_model_size", "124M", "--models_dir", str(tmp_path),
                   "--mirror", "http://127.0.0.1:9")  # port 9 (discard): nothing listens there
    assert out.returncode == 2 and "cannot reach" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.rglob("*.ckpt*"))  # nothing left under a final name


@pytest.mark.parametrize("name, flag", [("hf:foo/bar", "--hf_endpoint"), ("distilgpt2", "--hf_endpoint"),
                                        ("124M", "--mirror")])
def test_a_failed_download_leaves_no_folder_behind(tmp_path, name, flag, main_here):
    """Neither <models_dir>/foo/bar/ nor models_dir itself when this run made them; a folder the user had stays."""
    mine = tmp_path / "mine"
    mine.mkdir()
    for models_dir in (tmp_path / "weights", mine):
        out = main_here("--draft_model_size", name, "--models_dir", str(models_dir), flag, "http://127.0.0.1:9")
        assert out.returncode == 2 and "cannot reach" in out.stderr and out.stdout == "", out.stderr
    assert [p.name for p in tmp_path.rglob("*")] == ["mine"]


def test_a_json_path_that_cannot_be_written_is_refused_before_any_run(tmp_path, main_here):
    (tmp_path / "file").write_text("")
    for path, says in ((tmp_path / "absent" / "x.json", f"the folder {tmp_path / 'absent'} does not exist"),
                       (tmp_path, "is a folder: name a file in it"),
                       (tmp_path / "file" / "x.json", f"{tmp_path / 'file'} is not a folder")):
        out = main_here("--n_tokens_to_generate", "10", "--json", str(path))
        assert out.returncode == 2 and f"error: --json {path}" in out.stderr and says in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1 and out.stdout == ""  # refused before any work


def test_json_is_written_through_a_temporary_name_and_a_rename(tmp_path, monkeypatch):
    """A write that fails leaves the file that was there, and no temporary file; one that works replaces it."""
    from gpt2np import report  # compat.write_json writes through it (report.write_flag_file)
    path = tmp_path / "runs.json"
    path.write_text("the last run's\n")

    def failing_rename(*args):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", failing_rename)
    with pytest.raises(OSError, match="disk full"):
        report.write_atomically(path, "{}\n")
    assert path.read_text() == "the last run's\n" and [p.name for p in tmp_path.iterdir()] == ["runs.json"]
    monkeypatch.undo()
    report.write_atomically(path, "{}\n")
    assert path.read_text() == "{}\n" and [p.name for p in tmp_path.iterdir()] == ["runs.json"]
    assert path.stat().st_mode & 0o777 == 0o666 & ~current_umask()  # as open() makes it, not mkstemp's 0600


def current_umask():
    umask = os.umask(0)
    os.umask(umask)
    return umask


def test_corrupt_weights_are_a_one_line_error_naming_the_tensor(release_dirs, tmp_path):
    folder = tmp_path / "corrupt"
    shutil.copytree(release_dirs["gpt2-tiny-a"], folder)
    data = folder / "model.ckpt.data-00000-of-00001"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    out = run_main("--target_model_size", str(folder), "--n_tokens_to_generate", "2")
    assert out.returncode == 2 and "model/" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_mismatched_draft_and_target_vocabularies_are_refused(release_dirs):
    """The bundled byte-level draft (257 tokens) cannot draft for a GPT-2 vocabulary (50257)."""
    out = run_main("--draft_model_size", "shakespeare-260K", "--target_model_size", release_dirs["gpt2-tiny-b"])
    assert out.returncode == 2, out.stderr
    assert "257" in out.stderr and "50257" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert "autoregressive" not in out.stdout  # refused before any generation


def test_a_folder_whose_tokenizer_disagrees_with_hparams_is_refused(release_dirs, tmp_path):
    folder = tmp_path / "other-vocab"
    shutil.copytree(release_dirs["gpt2-tiny-a"], folder)
    from gpt2np.tokenizer.files import write_byte_level_vocab
    write_byte_level_vocab(folder)  # a 257-token vocabulary, while hparams says 50257
    out = run_main("--target_model_size", str(folder))
    assert out.returncode == 2 and "n_vocab=50257" in out.stderr, out.stderr


def test_no_arguments_runs_the_bundled_pair_offline():
    out = run_main("--n_tokens_to_generate", "30")
    assert out.returncode == 0, out.stderr
    assert "shakespeare-2.6M" in out.stdout and "alpha_hat" in out.stdout and "ROMEO" in out.stdout


def test_prompt_lookup_and_K_policies_from_the_command_line():
    """The bundled target with the n-gram drafter and auto K: identical to target-only at temperature 0."""
    out = run_main("--draft_model_size", "ngram", "--K", "auto", "--K_max", "6", "--n_tokens_to_generate", "60")
    assert out.returncode == 0, out.stderr
    sections = out.stdout.split("=== ")
    ar_text = sections[1].split("\n", 1)[1].split("\ntime:")[0]
    sd_text = sections[2].split("\n", 1)[1].split("\ntime:")[0]
    assert ar_text == sd_text
    assert "drafter ngram (n <= 3), K auto <= 6" in out.stdout
    assert "ngram (n <= 3), auto, K used" in out.stdout and "n/ax" not in out.stdout


def test_statistics_never_print_a_unit_after_a_missing_value():
    """--K 100000 over 5 tokens: v is never measured (no 100001-token call); it must read n/a."""
    out = run_main("--K", "100000", "--n_tokens_to_generate", "5")
    assert out.returncode == 0, out.stderr
    assert "n/a" in out.stdout and "n/ax" not in out.stdout


def test_starting_loads_neither_the_download_nor_the_test_machinery():
    """main.py imports gpt2np.cli; requests and tqdm (a download) and unittest.mock (tiktoken's build)
    load when they are used, not at every start: together they were a tenth of a second of 0.39 s."""
    lazy = ("requests", "tqdm", "unittest.mock")
    code = f"import sys, gpt2np.cli; print([m for m in {lazy} if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr[-2000:]


def test_a_closed_stdout_is_one_line_and_status_2(monkeypatch, capfd):
    """python main.py >&- (sys.stdout is None) was an AttributeError traceback at the first write (runs.py)."""
    from gpt2np import cli
    monkeypatch.setattr(sys, "argv", ["main.py", "--n_tokens_to_generate", "3"])
    monkeypatch.setattr(sys, "stdout", None)
    with pytest.raises(SystemExit) as exited:
        cli.run()
    assert exited.value.code == 2 and capfd.readouterr().err.startswith("error: stdout is closed: ")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="/dev/full is Linux's")
def test_a_json_write_that_fails_after_the_runs_names_the_flag(main_here):
    out = main_here("--n_tokens_to_generate", "3", "--json", "/dev/full")
    assert out.returncode == 2 and out.stderr == "error: --json /dev/full: No space left on device\n", out.stderr


def test_a_file_given_as_models_dir_or_as_a_model_folder_is_said_to_be_a_file(tmp_path, main_here):
    """--models_dir FILE was "[Errno 20] Not a directory: 'FILE/124M'"; --target_model_size FILE "no such folder"."""
    (tmp_path / "file").write_text("")
    file = str(tmp_path / "file")
    for args, says in ((["--target_model_size", "124M", "--models_dir", file], f"--models_dir {file} is not a folder"),
                       (["--target_model_size", "gpt2", "--models_dir", f"{file}/x"],
                        f"--models_dir {file}/x is not a folder ({file} is a file)"),
                       (["--target_model_size", file], f"{file} is a file, not a model folder: name the folder")):
        out = main_here(*args)
        assert out.returncode == 2 and out.stderr.startswith(f"error: {says}"), out.stderr
        assert len(out.stderr.splitlines()) == 1 and out.stdout == ""
