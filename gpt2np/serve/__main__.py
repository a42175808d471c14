"""python -m gpt2np.serve: the completions server and playground for a target and its drafter.

    python -m gpt2np.serve                                   # bundled pair, http://127.0.0.1:8000/
    python -m gpt2np.serve --target_model_size 355M --draft_model_size 124M --port 8080
    python -m gpt2np.serve --draft_model_size ngram          # prompt lookup, no draft model
    python -m gpt2np.serve --max_batch 1                     # one generation at a time
    python -m gpt2np.serve --allow_origin http://localhost:3000   # a page served from there may call it

Models are named as in main.py (a release size, a bundled name, hf:owner/name[@revision], a folder,
or "ngram" for the drafter); a model from a folder is served under the folder's name, never its
path. When the drafter is a model, the prompt-lookup drafter "ngram" is served beside it (it costs
nothing), and a request picks one with the field "drafter". Bad flags or models, a port in use or a
host that does not resolve: one line naming this command's flags, exit status 2, before the startup line
"serving ... on http://HOST:PORT/" (the socket is bound first: with --port 0 it names the port picked).
Then each request, once answered, is one line on stderr (time, client, method, path, status, seconds, a
completion's tokens or an error's message: requestlog.py; --quiet leaves them out), and the last line,
when it is stopped (Ctrl-C), says how many it served.

Up to --max_batch generations run at once (continuous batching, engine.py): plain requests share one
forward pass per token, speculative ones are packed with each other (a round each, one more pass per
step); up to --max_queue more wait, and past max_batch + max_queue in all the server answers 429
with Retry-After (a request that arrives while a step runs waits for the next step boundary, but a
free batch slot is room: it is never refused for it).
With --max_batch above 1 the weights take the memory order that passes over many rows want under
NumPy's BLAS kernel (row-major under the Haswell kernels, panels under SkylakeX:
gpt2np/model/fast/layout.py); the startup line names it.
"""
import errno
import socket
import sys

import gpt2np  # before NumPy: it sets OpenBLAS's thread timeout (gpt2np/__init__.py)
from gpt2np.report import (NO_DRAFTER, THREADS_HELP, OneLineErrorParser, add_loading_flags, check_model_names, check_tokenizer,
                           command_error_line, command_name, drafter_errors, run_command)

DEFAULT_TARGET, DEFAULT_DRAFT = "shakespeare-2.6M", "shakespeare-260K"
MAX_BATCH = 256  # generations running at once: far past where packing more rows gains anything; a typo is refused


def parse_args(argv):
    prog = command_name("python -m gpt2np.serve")  # gpt2np-serve when installed
    p = OneLineErrorParser(prog=prog, description=prog + __doc__.split("\n")[0].removeprefix("python -m gpt2np.serve"))
    p.add_argument("--target_model_size", default=DEFAULT_TARGET,
                   help=f"target: {', '.join(gpt2np.RELEASE_SIZES)} (OpenAI's release), a bundled name "
                        f"({', '.join(gpt2np.bundled_models())}), a Hub name hf:owner/name[@revision], or a folder "
                        f"in the release or Hugging Face layout, served under the folder's name (default: %(default)s)")
    p.add_argument("--draft_model_size", default=None,
                   help=f"drafter: a model named like the target, or 'ngram'; 'none': no draft model "
                        f"(default with the default target: {DEFAULT_DRAFT}, else none); 'ngram' is always served too")
    p.add_argument("--ngram_max", type=int, default=3,
                   help="longest n-gram the 'ngram' drafter looks up (default: %(default)s)")
    add_loading_flags(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s, this machine only)")
    p.add_argument("--port", type=int, default=8000,
                   help="port, 1..65535, or 0: any free port, named in the startup line (default: %(default)s)")
    p.add_argument("--max_batch", type=int, default=8,
                   help=f"generations running at once, at most {MAX_BATCH}; plain ones share one forward pass per "
                        f"token, so on a CPU 8 cost about 1.7 passes of one (1: one at a time; default: %(default)s)")
    p.add_argument("--prefill_chunk", type=int, default=256,
                   help="the most prompt tokens a newly admitted request feeds per step, so the running ones "
                        "are not held up long by a long prompt (default: %(default)s)")
    p.add_argument("--max_queue", type=int, default=16,
                   help="requests waiting beyond --max_batch running; past max_batch + max_queue in all, requests "
                        "are answered 429 (default: %(default)s)")
    p.add_argument("--max_body_bytes", type=int, default=256 * 1024,
                   help="larger request bodies get 413 (default: %(default)s, 256 KiB)")
    p.add_argument("--allow_origin", action="append", default=[], metavar="ORIGIN",
                   help="a web page's origin (scheme://host[:port], e.g. http://localhost:3000) allowed to call the "
                        "API from the browser (CORS); repeat it for several, or '*' for any page. By default only "
                        "the playground, served from the server itself, can")
    p.add_argument("--threads", type=int, default=None, help=THREADS_HELP)
    p.add_argument("--quiet", action="store_true",
                   help="no line per request on stderr (by default each request, once answered, gets one: time, "
                        "client, method, path, status, seconds, and a completion's tokens, how it ended and its "
                        "drafter, or an error's message, busy 429s included); the startup and shutdown lines stay")
    return p.parse_args(argv)


def check_args(args):
    """Every check that needs no model and no socket; a ValueError names the flag (as main.py's)."""
    for name in ("max_queue", "max_batch", "prefill_chunk", "ngram_max", "max_body_bytes"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.max_batch > MAX_BATCH:
        raise ValueError(f"--max_batch must be at most {MAX_BATCH}, got {args.max_batch}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be at least 1, got {args.threads}")
    check_model_names(args)
    if not args.host.strip():  # the empty host is every interface to the socket library: not by accident
        raise ValueError("--host is empty: leave it out to listen on this machine only (127.0.0.1), "
                         "or pass 0.0.0.0 to listen on every interface, knowingly")
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 1..65535 (or 0: any free port), got {args.port}")
    for origin in args.allow_origin:
        said = origin_problem(origin)
        if said:
            raise ValueError(f"--allow_origin {origin!r}: {said}")


def origin_problem(text):
    """None if a browser can send `text` as its Origin header (or it is '*', any page), else why not, in words: the
    CORS check compares the header as a string, so an origin written any other way refuses its page with nothing
    said. A browser sends scheme://host[:port]: no path, no user, the scheme and host in lower case, no port
    where it is the scheme's default.

    >>> [origin_problem(o) for o in ("*", "http://localhost:3000", "https://class.example.org", "http://[::1]:8080")]
    [None, None, None, None]
    >>> print(origin_problem("http://Localhost:3000/"))
    a browser sends scheme://host[:port] with no path, the host in lower case: http://localhost:3000
    >>> print(origin_problem("http://localhost:80"))
    a browser leaves out the scheme's default port: http://localhost
    >>> print(origin_problem("http://*.example.com"))
    one origin each (repeat the flag), or '*' for any page: no patterns
    """
    from urllib.parse import urlsplit
    if text == "*":
        return None
    if "*" in text:
        return "one origin each (repeat the flag), or '*' for any page: no patterns"
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        return "not an origin: scheme://host[:port], e.g. http://localhost:3000"
    if not parts.scheme or not parts.hostname or parts.username is not None or parts.password is not None:
        return "not an origin: scheme://host[:port], e.g. http://localhost:3000"
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    default = {"http": 80, "https": 443}.get(parts.scheme.lower())
    origin = f"{parts.scheme.lower()}://{host}" + (f":{port}" if port is not None and port != default else "")
    if port == default and port is not None and text.rstrip("/") == f"{parts.scheme}://{parts.netloc}":
        return f"a browser leaves out the scheme's default port: {origin}"
    if text != origin:
        return f"a browser sends scheme://host[:port] with no path, the host in lower case: {origin}"
    return None


def naming_flag(flag, name, load, *args, **kwargs):
    """load(*args, **kwargs), its errors prefixed with the flag and the name typed (one line, status 2) unless
    they begin with them already."""
    try:
        return load(*args, **kwargs)
    except (ValueError, OSError, gpt2np.DownloadError) as e:
        line = command_error_line(e)
        raise ValueError(line if line.startswith(f"{flag} {name} ") else f"{flag} {name}: {line}") from e


def load_drafter(*args, **kwargs):  # gpt2np.load_drafter, an unknown name said with ngram and none among the choices
    with drafter_errors():
        return gpt2np.load_drafter(*args, **kwargs)


def bind_socket(host, port):
    """A socket bound to host:port (port 0: a free one), not yet listening, so a client is refused, not
    kept waiting, while the models load; a ValueError names --host or --port."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise ValueError(f"--host {shown(host)}: {lowercase(e.strerror or str(e))}") from e
    except UnicodeError as e:  # the IDNA codec: a label over 63 characters, an empty one (a..b)
        raise ValueError(f"--host {shown(host)}: not a valid host name") from e
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart reuses the port at once
        sock.bind(address)
    except OSError as e:
        sock.close()
        why = lowercase(e.strerror or str(e))
        if e.errno == errno.EADDRNOTAVAIL:
            raise ValueError(f"--host {host}: {why} (not an address of this machine)") from e
        raise ValueError(f"--port {port} on {host}: {why}") from e
    return sock


def shown(host):  # -> host as typed, cut to 40 characters
    return host if len(host) <= 40 else host[:37] + "..."


def lowercase(message):
    return message[:1].lower() + message[1:]


def url(sock, host):
    """The address the server listens on, with the port the socket holds (port 0 picks one)."""
    port = sock.getsockname()[1]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def load_engine(args):
    """The target, its drafters by name, and the Engine around them (every check before serving)."""
    from gpt2np.serve.engine import Engine
    from gpt2np.serve.names import served_name
    check_args(args)
    sources = dict(base_url=args.mirror, hf_endpoint=args.hf_endpoint)
    naming_flag("--target_model_size", args.target_model_size, check_tokenizer, args.target_model_size,
                args.models_dir, "and the server answers in text",
                said=f"--target_model_size {args.target_model_size}")  # before the weights are built
    target = naming_flag("--target_model_size", args.target_model_size, gpt2np.load_model,
                         args.target_model_size, args.models_dir, **sources)
    draft = args.draft_model_size or (DEFAULT_DRAFT if args.target_model_size == DEFAULT_TARGET else NO_DRAFTER)
    drafters = {}
    if draft != NO_DRAFTER:
        drafter = naming_flag("--draft_model_size", draft, load_drafter, draft, args.models_dir,
                              n_max=args.ngram_max, target=target, **sources)
        naming_flag("--draft_model_size", draft, drafter.check, target, [0], 1)  # same vocabulary, refused now
        name = "ngram" if draft == "ngram" else served_name(drafter.name)
        if name == "ngram" and draft != "ngram":
            raise ValueError(f"--draft_model_size: the folder's name 'ngram' is the prompt-lookup drafter's: "
                             f"rename the folder {draft}")
        drafters[name] = drafter
    if "ngram" not in drafters:
        drafters["ngram"] = gpt2np.NgramDrafter(n_max=args.ngram_max)
    if args.max_batch > 1:  # the weights' order for passes over many rows, by BLAS kernel (model/fast/layout.py)
        for model in [target] + [d.model for d in drafters.values() if isinstance(d, gpt2np.ModelDrafter)]:
            gpt2np.order_for_batches(model)
    return Engine(target, drafters, max_queue=args.max_queue, max_batch=args.max_batch,
                  target_alone_by_default=draft == NO_DRAFTER,
                  prefill_chunk=args.prefill_chunk)  # a folder's name, never its path (names.py)


def main(argv=None):
    args = parse_args(argv)
    check_args(args)  # bad flags before the port is taken or a model is read
    try:
        import uvicorn
        from gpt2np.serve.app import create_app
    except ImportError as e:
        raise SystemExit(f"error: the server needs FastAPI and uvicorn: pip install -r requirements-serve.txt ({e})")
    with bind_socket(args.host, args.port) as sock:  # a taken port or unknown host before the models load
        engine = load_engine(args)
        if args.threads or engine.target.config.n_embd < 512:  # as main.py: one thread is faster for small models
            from threadpoolctl import threadpool_limits
            threadpool_limits(limits=args.threads or 1, user_api="blas")
        sock.listen(2048)  # uvicorn's backlog
        print(f"serving {engine.model_id} with drafters {list(engine.drafters)} on {url(sock, args.host)} "
              f"(up to {engine.max_batch} at once, {engine.max_queue} waiting; weights "
              f"{gpt2np.weights_order(engine.target)}; {gpt2np.blas_kernel()})", file=sys.stderr)
        if not args.quiet:
            log_requests_to_stderr()
        app = create_app(engine, args.max_body_bytes, log_requests=not args.quiet, allow_origins=args.allow_origin,
                         on_stop=lambda: print(
            f"stopped serving: {engine.served} served, {engine.cancelled} cancelled (client left), "
            f"{engine.failed} failed", file=sys.stderr, flush=True))
        # uvicorn at "warning": its startup lines would repeat the one above, and its access log knows
        # neither a completion's tokens nor how long its stream ran (requestlog.py's line does)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        server.run(sockets=[sock])  # the socket bound above: the address announced is the one served
    if not server.started:  # as uvicorn.run: the app failed to start (uvicorn logged why)
        sys.exit(3)
    stopped_by = getattr(server, "_captured_signals", None)  # uvicorn >= 0.29 re-raises the signal it stopped for,
    if stopped_by:  # into the handler the process started with: SIG_IGN in a script's background job (`&`), where
        sys.exit(128 + stopped_by[-1])  # it did nothing and the command exited 0: 130 as in a terminal, or 143


def log_requests_to_stderr():
    """requestlog.py's lines on stderr, each after the time of day."""
    import logging
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
    requests_log = logging.getLogger("gpt2np.serve.requests")
    requests_log.addHandler(handler)
    requests_log.setLevel(logging.INFO)
    requests_log.propagate = False  # once, here: not again through a handler the root logger may have


def run(argv=None):
    """main() as a command (report.run_command: one-line errors naming this command's flags, status 2)."""
    run_command(main, argv, writes_stdout=False)  # every line goes to stderr


if __name__ == "__main__":
    run()
