"""python -m gpt2np.serve as a command at startup: bad flags, a taken port, an unknown host and models that
cannot be loaded are one line `error: ...` naming the flag, exit status 2, before any "serving ..." line;
--port 0 announces the port the operating system picked.

Each test starts the real command in a subprocess, on 127.0.0.1 and a free port (--port 0) unless the
port is what it checks; one that starts serving when it should have refused is killed at its
"serving" line (a watchdog kills it after 60 s in any case). The flags refused before the port is taken
(main's check_args: EARLY_FLAGS) run the command's run() in this process instead, where taking the port
fails the test: the subprocesses' refusals (host, port, models) keep the real entry point tested.
"""
import re
import socket
import subprocess
import sys
import threading

import pytest

pytest.importorskip("fastapi", reason="the server needs FastAPI (pip install -r requirements-serve.txt)")
pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install -r requirements-serve.txt)")
import requests  # noqa: E402

SERVE = [sys.executable, "-m", "gpt2np.serve", "--draft_model_size", "ngram"]


def start(*flags):
    process = subprocess.Popen([*SERVE, *flags], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(60, process.kill)
    watchdog.start()
    return process, watchdog


def refused(*flags):
    """The command's stderr and exit status; a server that starts serving is stopped at once."""
    process, watchdog = start(*flags)
    lines = []
    try:
        for line in process.stderr:
            lines.append(line)
            if line.startswith("serving "):
                break
    finally:
        process.kill()
        process.wait(timeout=30)
        watchdog.cancel()
        process.stderr.close()
    stderr = "".join(lines)
    if any(line.startswith("serving ") for line in lines):
        return None, stderr
    return process.returncode, stderr


def refused_before_the_port(monkeypatch, capsys, *flags):
    """run(flags) in this process: its exit status and stderr, for flags refused before the port is taken
    (binding one fails the test, so nothing is ever served here)."""
    from gpt2np.serve import __main__ as command

    def bind_socket(host, port):
        raise AssertionError(f"{flags}: passed main's checks and went on to take the port")
    monkeypatch.setattr(command, "bind_socket", bind_socket)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        command.run(list(flags))
    return exited.value.code, capsys.readouterr().err


def assert_one_line_error(flags, expected, status_and_stderr=None):
    status, stderr = status_and_stderr or refused(*flags)
    assert status == 2 and len(stderr.strip().splitlines()) == 1, stderr
    assert stderr.startswith(f"error: {expected}"), stderr
    assert "Traceback" not in stderr and "serving" not in stderr, stderr


EARLY_FLAGS = [
    (["--port", "-1"], "--port must be in 1..65535 (or 0: any free port), got -1"),
    (["--port", "70000"], "--port must be in 1..65535 (or 0: any free port), got 70000"),
    (["--threads", "0"], "--threads must be at least 1, got 0"),
    (["--threads", "-1"], "--threads must be at least 1, got -1"),
    (["--max_batch", "1000000000000"], "--max_batch must be at most 256, got 1000000000000"),
    (["--draft_model_size", ""], "--draft_model_size is empty: name a model"),
    (["--target_model_size", ""], "--target_model_size is empty: name a model"),
    (["--host", ""], "--host is empty:"),
    (["--allow_origin", "http://localhost:3000/"], "--allow_origin 'http://localhost:3000/': a browser sends "
                                                   "scheme://host[:port] with no path, the host in lower case: "
                                                   "http://localhost:3000"),
    (["--allow_origin", "http://Localhost:3000"], "--allow_origin 'http://Localhost:3000': a browser sends "
                                                  "scheme://host[:port] with no path, the host in lower case: "
                                                  "http://localhost:3000"),
    (["--allow_origin", "http://localhost:80"], "--allow_origin 'http://localhost:80': a browser leaves out the "
                                                "scheme's default port: http://localhost"),
    (["--allow_origin", "http://*.example.com"], "--allow_origin 'http://*.example.com': one origin each"),
    (["--allow_origin", "localhost:3000"], "--allow_origin 'localhost:3000': not an origin: scheme://host[:port]"),
    (["--allow_origin", "http://localhost:99999"], "--allow_origin 'http://localhost:99999': not an origin"),
]
BAD_FLAGS = [
    (["--host", "nonsense.invalid"], "--host nonsense.invalid: name or service not known"),
    (["--host", "999.1.1.1"], "--host 999.1.1.1: name or service not known"),
    (["--target_model_size", "nosuch"], "--target_model_size nosuch: unknown model 'nosuch'"),
    (["--draft_model_size", "nosuch"], "--draft_model_size nosuch: unknown model 'nosuch'"),
    (["--draft_model_size", "ngarm"], "--draft_model_size ngarm: unknown model 'ngarm' (did you mean ngram?)"),
]


@pytest.mark.parametrize("flags, expected", BAD_FLAGS, ids=[" ".join(flags) for flags, _ in BAD_FLAGS])
def test_bad_startup_flags_are_one_line_errors_naming_the_flag(flags, expected):
    port = [] if "--port" in flags else ["--port", "0"]  # never the default 8000, should one start serving
    assert_one_line_error([*flags, *port], expected)


@pytest.mark.parametrize("flags, expected", EARLY_FLAGS, ids=[" ".join(flags) for flags, _ in EARLY_FLAGS])
def test_flags_refused_before_the_port_is_taken(monkeypatch, capsys, flags, expected):
    port = [] if "--port" in flags else ["--port", "0"]
    assert_one_line_error(flags, expected, refused_before_the_port(monkeypatch, capsys, *flags, *port))


def test_an_empty_host_says_how_to_listen_everywhere(monkeypatch, capsys):
    _, stderr = refused_before_the_port(monkeypatch, capsys, "--host", "", "--port", "0")
    assert "0.0.0.0" in stderr and "every interface" in stderr, stderr


def test_a_port_in_use_is_refused_before_the_serving_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert_one_line_error(["--port", str(port)], f"--port {port} on 127.0.0.1: address already in use")


def test_port_zero_announces_the_port_it_serves_on():
    """The command as typed, with --port 0 (and --allow_origin, which the app gets: CORS headers for that page)."""
    process, watchdog = start("--port", "0", "--allow_origin", "http://localhost:3000")
    try:
        line = ""
        for line in process.stderr:
            if line.startswith("serving "):
                break
        found = re.search(r" on http://127\.0\.0\.1:(\d+)/ ", line)
        assert found and int(found.group(1)) != 0, line
        health = requests.get(f"http://127.0.0.1:{found.group(1)}/health", timeout=30)
        assert health.status_code == 200 and health.json()["status"] == "ok"
        page = requests.get(f"http://127.0.0.1:{found.group(1)}/health", headers={"Origin": "http://localhost:3000"},
                            timeout=30)
        assert page.headers.get("Access-Control-Allow-Origin") == "http://localhost:3000", page.headers
    finally:
        process.kill()
        process.wait(timeout=30)
        watchdog.cancel()
        process.stderr.close()


# what pip writes for [project.scripts]' gpt2np-serve (pyproject.toml): the installed command
LAUNCHER = """import re, sys
from gpt2np.serve.__main__ import run
if __name__ == "__main__":
    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
    sys.exit(run())
"""


@pytest.mark.parametrize("installed", [False, True], ids=["python -m gpt2np.serve", "gpt2np-serve"])
def test_usage_and_errors_name_the_command_as_typed(tmp_path, installed):
    """The installed gpt2np-serve printed "usage: python -m gpt2np.serve ..." and "python -m gpt2np.serve:
    error: ..." (a name the user never typed); each spelling now names itself."""
    import os
    from pathlib import Path
    command = "gpt2np-serve" if installed else "python -m gpt2np.serve"
    if installed:
        (tmp_path / "gpt2np-serve").write_text(LAUNCHER)
        argv = [sys.executable, str(tmp_path / "gpt2np-serve")]
    else:
        argv = [sys.executable, "-m", "gpt2np.serve"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    shown = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=120, env=env)
    assert shown.returncode == 0 and shown.stdout.startswith(f"usage: {command} ["), shown.stdout[:200]
    assert f"\n{command}: the completions server" in shown.stdout, shown.stdout
    other = "python -m gpt2np.serve" if installed else "gpt2np-serve "
    assert other not in shown.stdout.split("\n\n")[0], shown.stdout[:300]
    bad = subprocess.run([*argv, "--tmperature", "1"], capture_output=True, text=True, timeout=120, env=env)
    assert bad.returncode == 2 and bad.stderr == f"{command}: error: unrecognized arguments: --tmperature 1 (see --help)\n", \
        bad.stderr


@pytest.mark.parametrize("host, shown", [("a" * 300, "a" * 37 + "..."), ("a..b", "a..b")])
def test_a_host_the_idna_codec_refuses_is_not_a_valid_host_name(host, shown):
    """It was "encoding with 'idna' codec failed (UnicodeError: label too long)", the flag unnamed."""
    from gpt2np.serve.__main__ import bind_socket
    with pytest.raises(ValueError) as refused:
        bind_socket(host, 0)
    assert str(refused.value) == f"--host {shown}: not a valid host name"
