"""The FastAPI application: `create_app(engine)`, the routes below reading the engine from app.state.

Routes: POST /predict (the seed's curl-able interface), POST /v1/completions (OpenAI's, streaming
with server-sent events), GET /v1/models, GET /health, GET / (the playground), and FastAPI's /docs;
HEAD wherever this module allows GET (a proxy's or a monitor's health check may send HEAD).
Every error is JSON in OpenAI's shape, {"error": {"message", "type", "param", "code"}}, with a
4xx status for anything the client can fix; no traceback and no local path ever reaches a client.
"""
import asyncio
import contextlib
import json
import logging
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

import gpt2np

from .completions import SSE_DONE, Completion, final_of, new_id, sse, usage_chunk_of
from .engine import Generation, QueueFull, RequestError, new_seed
from .names import without_paths
from .requestlog import RequestLog, note
from .schemas import FIELD_HELP, PREDICT_HELP, CompletionRequest, PredictRequest

PAGE = Path(__file__).parent / "static" / "index.html"
MAX_BODY_BYTES = 256 * 1024
log = logging.getLogger("gpt2np.serve")


def error(status, message, param=None, kind="invalid_request_error", code=None, headers=None):
    """OpenAI's error object; the message never shows a local path (names.without_paths)."""
    body = {"error": {"message": without_paths(message), "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def sent(value, longest=60):
    """A value as the client sent it (JSON), shortened to one short line."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= longest else text[:longest - 3] + "..."


def validation_message(errors, path="this route", content_type=None, body=None):
    """pydantic's errors -> (field, one line): the first field at fault, in words. content_type: the
    request's Content-Type header (None: there was none); body: the request's parsed JSON, whose value
    for the field the message quotes ("got ...")."""
    first = errors[0]
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    if first.get("type") == "json_invalid":
        return None, f"invalid JSON in the request body ({first.get('ctx', {}).get('error', 'cannot parse')})"
    if not loc:  # the body itself, or a check across fields ("echo: ...")
        msg = first.get("msg", "invalid request").removeprefix("Value error, ")
        field = msg.split(":")[0] if ":" in msg else None
        if isinstance(first.get("input"), bytes):  # FastAPI parses JSON only when the header says JSON
            return None, (f"the request body must be JSON sent with Content-Type: application/json "
                          f"({'got ' + repr(content_type) if content_type else 'none was sent'})")
        if first.get("type") == "missing":
            return None, "the request body is empty: send a JSON object"
        return field, msg if field else f"the request body must be a JSON object, got {sent(first.get('input'))}"
    field = loc[0]
    if first.get("type") == "extra_forbidden":
        return field, f"{'.'.join(loc)}: unknown field, refused rather than ignored (POST {path}'s fields: GET /docs)"
    hints = PREDICT_HELP if path == "/predict" else FIELD_HELP
    if field in hints and first.get("type") == "missing":
        return field, f"{field}: required ({hints[field]})"
    if field == "prompt" and isinstance(body, dict) and (wrong := bad_prompt_in_list(body.get("prompt"))):
        return field, wrong
    if field in hints:  # any type or range error, each branch of a union too: what it may be, and what came
        got = f", got {sent(body[field])}" if isinstance(body, dict) and field in body else ""
        return field, f"{field}: {hints[field]}{got}"
    if first.get("type") == "none_required":
        return field, f"{field}: not supported by this server (leave it out or null)"
    if first.get("type") == "finite_number":
        return field, f"{'.'.join(loc)}: must be a finite number, got {first.get('input')!r}"
    where = ".".join(loc[:1] + [x for x in loc[1:] if x.isdigit()])
    return field, f"{where}: {first.get('msg', 'invalid value').replace('Input should be', 'must be')}"


def bad_prompt_in_list(prompt):  # -> "prompt[i]: ..." for the first item of a list of prompts that is no prompt
    """A list of prompts (some item a string or a list) whose item i is neither a string nor a non-empty list of
    token ids: said of that item (a list of 300 prompts is cut short in the general message). None otherwise."""
    if not isinstance(prompt, list) or not any(isinstance(p, (str, list)) for p in prompt):
        return None
    for i, p in enumerate(prompt):
        ids = isinstance(p, list) and p and all(type(t) is int and t >= 0 for t in p)
        if not (isinstance(p, str) or ids):
            return f"prompt[{i}]: must be a string or a non-empty list of token ids (integers >= 0), got {sent(p)}"
    return None


class BodyLimit:
    """ASGI middleware: bodies over max_bytes get 413, whether or not Content-Length says so."""

    def __init__(self, app, max_bytes):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length", b"0")
        too_big = not length.isdigit() or int(length) > self.max_bytes
        body, messages = 0, []
        while not too_big:  # read the body here, so a chunked upload is measured too
            message = await receive()
            messages.append(message)
            body += len(message.get("body", b""))
            too_big = body > self.max_bytes
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        if too_big:
            response = error(413, f"the request body is larger than {self.max_bytes} bytes", kind="request_too_large")
            return await response(scope, receive, send)

        async def replay():
            return messages.pop(0) if messages else await receive()
        await self.app(scope, replay, send)


class Crashes:
    """ASGI middleware, inside CORS: an unhandled error becomes crashed()'s 500 here, so that its answer carries the
    CORS headers a page's script needs to read it (the handler Starlette calls for Exception sits outside every
    middleware: its 500 had none, and the page saw a network error). One that comes after the answer began
    (a stream) goes on up, as before."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def sending(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)
        try:
            await self.app(scope, receive, sending)
        except Exception as exc:
            if started:
                raise
            await (await crashed(None, exc))(scope, receive, send)


class CORS(CORSMiddleware):
    """Starlette's CORS middleware, its refused preflight in OpenAI's error shape (it is plain text there), naming
    the origin and what the server allows. A browser shows neither to the page's script, but whoever reads the
    server's answers (curl, the log) sees why."""

    def preflight_response(self, request_headers):
        response = super().preflight_response(request_headers)
        if response.status_code != 400:
            return response
        refused = response.body.decode().removeprefix("Disallowed CORS ")
        origin = request_headers.get("origin", "")
        allowed = "any origin" if self.allow_all_origins else ", ".join(sorted(self.allow_origins)) or "none"
        body = error(400, f"CORS preflight refused ({refused}) for the origin {origin!r}: this server allows "
                          f"{allowed} (--allow_origin) and the methods {', '.join(sorted(self.allow_methods))}",
                     param=None)
        body.headers.update({k: v for k, v in response.headers.items() if k.lower().startswith("access-control-")})
        return body


class ClosingStreamingResponse(StreamingResponse):
    """A StreamingResponse that always closes its generator, however the response ends (a client
    that disconnects makes send() fail or cancels the stream): the generator's cleanup cancels the job."""

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


async def invalid(request, exc):
    field, message = validation_message(exc.errors(), request.url.path, request.headers.get("content-type"),
                                        getattr(exc, "body", None))
    return error(400, message, param=field)


ROUTES = "POST /v1/completions, POST /predict, GET /v1/models, GET /health (GET /docs)"


async def http_error(request, exc):
    """FastAPI's own errors, said so that a client knows what to do: a body it could not parse, a path it does not
    serve (/v1/chat/completions: GPT-2 has no chat format), a method a path does not take (with its Allow header)."""
    where = f"{request.method} {request.url.path}"
    if exc.status_code == 400:  # FastAPI's one 400 of its own: a body json.loads could not read at all
        return error(400, f"the request body could not be parsed ({exc.detail}): send a UTF-8 JSON object (not "
                          f"nested thousands deep, no number of thousands of digits)", headers=exc.headers)
    if exc.status_code == 404:
        chat = " (GPT-2 has no chat format: send the text to continue as a prompt)" if "chat" in where else ""
        return error(404, f"{where} is not served here{chat}; this server serves {ROUTES}", kind="not_found",
                     headers=exc.headers)
    if exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        return error(405, f"{where}: method not allowed{f' (allowed: {allowed})' if allowed else ''}",
                     kind="http_error", headers=exc.headers)
    return error(exc.status_code, str(exc.detail), kind="http_error", headers=exc.headers)


async def crashed(request, exc):  # a bug, never the client's fault: logged here, not sent
    log.exception("unhandled error")
    return error(500, "internal server error", kind="server_error")


@contextlib.asynccontextmanager
async def lifespan(app):  # the worker lives as long as the application
    app.state.engine.start()
    yield
    app.state.engine.stop()
    if app.state.on_stop is not None:
        app.state.on_stop()


def create_app(engine, max_body_bytes=MAX_BODY_BYTES, log_requests=False, on_stop=None, allow_origins=()):
    """The application serving `engine` (engine.Engine; started and stopped with the app); log_requests:
    one line per request to the logger "gpt2np.serve.requests" (requestlog.py); on_stop: called once the
    worker has stopped, at shutdown (before uvicorn passes a Ctrl-C or SIGTERM on to the process);
    allow_origins: web pages' origins ("http://localhost:3000", or "*") whose scripts may call the API (CORS:
    the browser asks first, OPTIONS, and reads the answer only if it names the page's origin)."""
    app = FastAPI(lifespan=lifespan, title="gpt2np", description="GPT-2 in NumPy with speculative decoding: OpenAI-compatible "
                  "completions with per-token provenance (draft / resample / bonus).", version="1.0")
    app.state.engine, app.state.on_stop = engine, on_stop
    app.add_middleware(Crashes)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    if allow_origins:  # outside BodyLimit: a 413 reaches the page's script too
        app.add_middleware(CORS, allow_origins=list(allow_origins), allow_methods=["GET", "HEAD", "POST"],
                           allow_headers=["*"], expose_headers=["Retry-After"], max_age=600)
    if log_requests:  # added last, so outermost: it sees the 413s too
        app.add_middleware(RequestLog)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, crashed)
    app.include_router(routes)
    return app


def generation(engine, body, ids, choice=0):
    """The request's fields as a Generation, checked against the model (RequestError); choice: its place among
    a prompt's n choices (its seed is the request's + choice). speculative false: the target alone, whatever
    drafting fields came with it (they cannot change the output: a client that toggles speculative sends them)."""
    drafter = (body.drafter or engine.default_drafter) if body.speculative else None
    if body.speculative and drafter is None:  # no default drafter: the target alone, unless drafting was asked for
        asked = [name for name in ("speculative", "K", "gamma", "K_max", "tree") if name in body.model_fields_set]
        if asked and engine.drafters:
            raise RequestError(asked[0], f"{asked[0]}: this server drafts only with a drafter the request names (it "
                                         f"serves the target alone by default): send drafter "
                                         f"{' or '.join(map(repr, engine.drafters))}")
        if asked:
            raise RequestError(asked[0], "this server has no drafter: send speculative false")
    g = Generation(prompt_ids=tuple(ids), max_tokens=body.new_tokens(len(ids)), temperature=body.temperature,
                   top_k=body.top_k, top_p=None if body.top_p == 1 else body.top_p,
                   seed=new_seed() if body.seed is None else body.seed + choice, K=body.K, K_max=body.K_max,
                   drafter=drafter, tree=None if drafter is None else tuple(body.tree) if isinstance(body.tree, list)
                   else body.tree)
    try:
        engine.check(g)
    except RequestError as e:  # about max_tokens: name the field as the request spelled it
        name = body.max_tokens_name()
        if e.param != "max_tokens" or name == "max_tokens":
            raise
        said = f"max_length {body.max_length} means max_tokens {g.max_tokens}: {e}" if name == "max_length" \
            else str(e).replace("max_tokens", name)
        raise RequestError(name, said) from None
    return g


async def run(engine, jobs, completions, request):
    """Collect every job's rounds into its completion (non-streaming); stop if the client leaves. Returns
    None, or an error response (a job's error: the others are stopped)."""
    loop, ended = asyncio.get_running_loop(), set()
    checked = loop.time()
    try:
        while len(ended) < len(jobs):
            try:
                i, message = await asyncio.wait_for(jobs[0].inbox.get(), timeout=0.25)
            except asyncio.TimeoutError:
                i, message = None, ("wait",)
            if loop.time() - checked > 0.25:  # a few times a second: has the client gone?
                if await request.is_disconnected():
                    return None  # nobody to answer: the finally below frees the worker
                checked = loop.time()
            if i in ended:
                continue  # what a job sent after its stop string, before the worker saw finish()
            completion = completions[i] if i is not None else None
            if message[0] == "round":
                completion.add_round(*message[1:], engine.target.eot_id)
                if completion.done:  # a stop string: this prompt has its answer
                    stop_early(jobs[i], completion)
                    ended.add(i)
            elif message[0] == "done":
                completion.finish(*message[1:])
                ended.add(i)
            elif message[0] == "error":
                return error(message[1], message[2], kind="server_error" if message[1] >= 500 else
                             "invalid_request_error")
    finally:
        for job, completion in zip(jobs, completions):  # done, stopped by a stop string, or cancelled
            stop_early(job, completion)


def stop_early(job, completion):
    """The request is over: a stop string ended it (finish: served), or its client left (cancel). After
    the job's own end ("done", "error") this changes nothing; before it, the worker stops the job."""
    if completion.done:
        job.finish()
    else:
        job.cancel()


async def events(engine, jobs, completions, include_usage=False, n=1):
    """The streaming answer: one server-sent event per round of each choice (its index tells them apart),
    each choice's last with its finish_reason; then (include_usage) one with no choices and the request's
    usage (each prompt counted once, whatever n), as OpenAI's stream_options, then [DONE]."""
    ended = set()  # prompts whose last text event was sent
    try:
        while len(ended) < len(jobs):
            i, message = await jobs[0].inbox.get()
            if i in ended:
                continue
            completion = completions[i]
            if message[0] == "round":
                text, entries = completion.add_round(*message[1:], engine.target.eot_id)
                if completion.done:
                    yield sse(completion.last_chunk(text, entries))
                    stop_early(jobs[i], completion)
                    ended.add(i)
                else:
                    yield sse(completion.chunk(text, entries, completion.rounds[-1]))
            elif message[0] == "done":
                yield sse(completion.last_chunk(completion.finish(*message[1:])))
                ended.add(i)
            elif message[0] == "error":
                yield sse({"error": {"message": without_paths(message[2]), "type": "server_error", "param": None,
                                     "code": None}})
                break
            else:
                return
        if include_usage and len(ended) == len(jobs):
            yield sse(usage_chunk_of(completions, n))
        yield SSE_DONE
    finally:
        for job, completion in zip(jobs, completions):
            stop_early(job, completion)


def refused(e):
    if isinstance(e, QueueFull):
        return error(e.status, str(e), kind="rate_limit_error" if e.status == 429 else "server_unavailable",
                     code="queue_full" if e.status == 429 else None, headers={"Retry-After": str(e.retry_after)})
    return error(400, str(e), param=e.param)


routes = APIRouter()


@routes.post("/v1/completions", summary="OpenAI-compatible completion (stream: server-sent events)")
async def completions(body: CompletionRequest, request: Request):
    engine = request.app.state.engine
    if body.model is not None and body.model != engine.model_id:
        return model_not_served(engine, body.model)
    try:
        gs = generations(engine, body)
        cid, several = new_id(), body.listed() or body.n > 1
        completions = [Completion(engine.model_id, g, len(g.prompt_ids), body.stops(), index=i, id=cid,
                                  several=several) for i, g in enumerate(gs)]
        note(request, completions, body.stream, body.n)
        jobs = engine.submit_all(gs, asyncio.get_running_loop())
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return ClosingStreamingResponse(events(engine, jobs, completions, include_usage, body.n),
                                            media_type="text/event-stream",
                                            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        failed = await run(engine, jobs, completions, request)
    except (RequestError, QueueFull) as e:
        return refused(e)
    return failed or final_of(completions, body.n)


def generations(engine, body):
    """A request's prompts as Generations, n a prompt in OpenAI's order (choice i * n + j: prompt i's j-th),
    each checked (RequestError); a fault in one of several prompts says which (prompt[i], counted from 0),
    and they must fit the server at once (max_batch + max_queue: more would never be served together)."""
    prompts, n = body.prompts(), body.n
    if len(prompts) * n > engine.capacity:
        asked = f"{len(prompts)} prompts" if n == 1 else f"{len(prompts)} prompt{'s' * (len(prompts) > 1)} x n {n}"
        raise RequestError("prompt" if n == 1 else "n",
                           f"{'prompt' if n == 1 else 'n'}: {asked}, more generations than this server takes at "
                           f"once ({engine.capacity}: --max_batch {engine.max_batch} + --max_queue "
                           f"{engine.max_queue}): send at most {engine.capacity} generations (prompts x n) a request")
    gs = []
    for i, prompt in enumerate(prompts):
        try:
            ids = engine.encode(prompt)
            gs += [generation(engine, body, ids, j) for j in range(n)]
        except RequestError as e:  # a prompt's own fault says which; a fault of the whole request does not
            if len(prompts) == 1 or e.param not in PER_PROMPT:
                raise
            raise RequestError(e.param, f"prompt[{i}]: {str(e).removeprefix('prompt: ')}") from None
    return gs


PER_PROMPT = ("prompt", "max_tokens", "max_new_tokens", "max_length")  # faults that depend on the prompt (its ids,
                                                                       # its length against the context)


@routes.post("/predict", summary="The seed's interface: {\"prompt\": ...} -> text and statistics")
async def predict(body: PredictRequest, request: Request):
    engine = request.app.state.engine
    try:
        ids = engine.encode(body.prompt)
        g = generation(engine, body, ids)
        completion = Completion(engine.model_id, g, len(ids))
        note(request, [completion])
        failed = await run(engine, [engine.submit(g, asyncio.get_running_loop())], [completion], request)
    except (RequestError, QueueFull) as e:
        return refused(e)
    if failed:
        return failed
    live = completion.live or {}
    return {"prompt": body.prompt, "text": completion.text.text, "model": engine.model_id,
            "finish_reason": completion.finish_reason, "usage": completion.usage(),
            "tokens": [int(t) for t in completion.tokens], "provenance": completion.provenance,
            "seconds": live.get("seconds"), "tokens_per_second": live.get("tokens_per_second"),
            "seed": g.seed, "stats": completion.stats or live}


@routes.get("/v1/models", summary="The served model (OpenAI's list), with its drafters")
async def models(request: Request):
    return {"object": "list", "data": [model_object(request.app.state.engine)]}


@routes.get("/v1/models/{model_id:path}", summary="The served model, by its id (OpenAI's retrieve)")
async def model(model_id: str, request: Request):
    engine = request.app.state.engine
    if model_id != engine.model_id:
        return model_not_served(engine, model_id)
    return model_object(engine)


def model_not_served(engine, model_id):  # a completion's model field, or GET /v1/models/{id}: 404
    return error(404, f"model: the model {model_id!r} is not served here; this server serves {engine.model_id!r} "
                      f"(GET /v1/models)", param="model", code="model_not_found")


def model_object(engine):  # OpenAI's model object, with gpt2np's own fields
    return {"id": engine.model_id, "object": "model", "created": 0, "owned_by": "gpt2np",
            "gpt2np": {"n_ctx": engine.n_ctx, "n_vocab": engine.target.n_vocab,
                       "drafters": list(engine.drafters), "default_drafter": engine.default_drafter}}


@routes.get("/health", summary="Liveness: the worker is running; generations active and queued")
async def health(request: Request):
    """For a reverse proxy: 200 while the worker runs (503 when not); active of max_batch running,
    queued waiting for a step boundary (429 once active + queued reach max_batch + max_queue); served:
    answered (max_tokens, <|endoftext|> or a stop string), cancelled: the client left, failed: errors;
    blas: NumPy's BLAS kernel in this process (gpt2np.blas_kernel()), for whoever times the server."""
    engine = request.app.state.engine
    body = {"status": "ok" if engine.alive else "worker stopped", "model": engine.model_id,
            "active": engine.active, "max_batch": engine.max_batch, "queued": engine.queued,
            "max_queue": engine.max_queue, "busy": engine.busy, "served": engine.served,
            "cancelled": engine.cancelled, "failed": engine.failed, "blas": gpt2np.blas_kernel()}
    return JSONResponse(body, status_code=200 if engine.alive else 503)


@routes.get("/", response_class=HTMLResponse, include_in_schema=False)
async def page():
    return HTMLResponse(PAGE.read_text(encoding="utf-8"))


for _path, _endpoint in (("/v1/models", models), ("/health", health), ("/", page)):  # HEAD where GET is: the
    routes.add_api_route(_path, _endpoint, methods=["HEAD"], include_in_schema=False)  # headers, no body (uvicorn)
