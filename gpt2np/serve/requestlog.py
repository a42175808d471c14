"""One log line per HTTP request, written when the request is over (the command prints them on stderr).

    12:03:04 127.0.0.1 POST /v1/completions 200 0.412 s: 6 prompt + 40 completion tokens (length), drafter shakespeare-260K K 4
    12:03:04 127.0.0.1 POST /v1/completions 200 1.020 s: 6 prompt + 12 completion tokens, target only, streamed, client left
    12:03:05 127.0.0.1 POST /v1/completions 429 0.001 s: the server is busy: 1 s until a slot is likely free
    12:03:05 127.0.0.1 POST /predict 400 0.002 s: temperature: must be a finite number >= 0 (0 means greedy), ...
    12:03:06 127.0.0.1 GET /health 200 0.001 s

The line is the client's address, the method and path (never the query: the playground's ?prompt=),
the status, the seconds until the answer's last byte (a stream's whole length), and for a completion
its tokens, how it ended and how it was decoded; for an error, its message. uvicorn's own access log
(off: the command runs uvicorn at log level "warning") knows neither the tokens nor the seconds.

RequestLog is ASGI middleware: a route hands it the request's Completions (one per prompt) with
`note(request, completions)`, and the line is logged to the logger "gpt2np.serve.requests" at INFO.
"""
import json
import logging
import time

from .completions import usage_of

log = logging.getLogger("gpt2np.serve.requests")
KEY = "gpt2np.request_log"  # the scope entry a route writes its completion into
MOST_ERROR_BYTES = 4096     # an error's body kept to read its message (they are one line)


def note(request, completions, stream=False, n=1):
    """Tell the request's log line about its completions, one per choice (tokens, finish_reason, drafter),
    whether they are streamed, and n (choices a prompt)."""
    record = request.scope.get(KEY)
    if record is not None:
        record.update(completions=completions, stream=stream, n=n)


class RequestLog:
    """ASGI middleware: one line per HTTP request once its answer is sent (or its client left)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, record = time.perf_counter(), {}
        scope[KEY] = record
        answer = {"status": None, "body": b""}

        async def sending(message):
            if message["type"] == "http.response.start":
                answer["status"] = message["status"]
            elif message["type"] == "http.response.body" and (answer["status"] or 0) >= 400 \
                    and len(answer["body"]) < MOST_ERROR_BYTES:
                answer["body"] += message.get("body", b"")
            await send(message)
        try:
            await self.app(scope, receive, sending)
        except BaseException:
            answer["status"] = answer["status"] or 500  # the error handler outside answers 500
            raise
        finally:
            log.info(line(scope, answer, record.get("completions"), time.perf_counter() - start,
                          record.get("stream", False), record.get("n", 1)))


def line(scope, answer, completions, seconds, stream=False, n=1):
    """The log line (without the time of day, which the handler's format adds)."""
    client = (scope.get("client") or ("-",))[0]
    status = answer["status"] or "-"  # no status: the client left before an answer began
    head = f"{client} {scope.get('method', '-')} {scope.get('path', '-')} {status} {seconds:.3f} s"
    said = completion_said(completions, answer["status"], stream, n) if completions else None
    if said is None and answer["status"] is None:
        said = "client left before an answer"
    if said is None and answer["status"] >= 400:
        said = error_said(answer)
    return f"{head}: {said}" if said else head


def completion_said(completions, status, stream, n=1):
    """Their tokens, how they ended and how they were decoded; None if they never ran (an error answered).
    Several choices: "3 prompts:" (or "2 prompts x n 3:", "n 3:"), the tokens as usage counts them (each
    prompt once), each choice's ending in order."""
    if status is None or status >= 400:
        return None
    g, prompts = completions[0].generation, len(completions) // n
    ended = [c.finish_reason for c in completions]
    how = f"drafter {g.drafter} " + (f"tree {list(g.tree) if isinstance(g.tree, tuple) else g.tree}"
                                     if g.tree is not None else f"K {g.K}") if g.drafter else "target only"
    head = (f"{prompts} prompts" if prompts > 1 else "") + (" x " if prompts > 1 and n > 1 else "") + \
        (f"n {n}" if n > 1 else "")
    endings = ", ".join(e or "unfinished" for e in ended) if any(ended) else ""
    usage = usage_of(completions, n)
    parts = [f"{head + ': ' if head else ''}{usage['prompt_tokens']} prompt + {usage['completion_tokens']} "
             f"completion tokens" + (f" ({endings})" if endings else ""), how] + (["streamed"] if stream else [])
    if not all(ended):
        parts.append("client left")
    return ", ".join(parts)


def error_said(answer):
    """The error's message (OpenAI's shape: a 429 says "the server is busy: N s until ..."), else nothing."""
    try:
        return str(json.loads(answer["body"])["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return ""
