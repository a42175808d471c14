"""OpenAI's completion objects and server-sent events, from the engine's round messages.

A completion (https://platform.openai.com/docs/api-reference/completions/object) is
{"id", "object": "text_completion", "created", "model", "choices": [{"text", "index", "logprobs",
"finish_reason"}], "usage"}; a streamed one is the same object once per event, each carrying the
new text, framed as `data: <json>\\n\\n` and closed by `data: [DONE]\\n\\n` (the SSE framing the
openai client reads). gpt2np adds one object, "gpt2np", with where each token came from
(provenance: draft / resample / bonus / target) and the round statistics.

finish_reason: "length" when max_tokens were generated, "stop" for <|endoftext|> or a stop string.

A request of a list of prompts, or of n choices a prompt, is one Completion per choice, sharing the
request's id: final_of joins them (a choice each, in OpenAI's order, "gpt2np" a list of each choice's
object with its own usage, and the request's usage: each prompt counted once); streamed, each event is
one choice's, told apart by its index, and OpenAI's usage is only in the include_usage event.
"""
import json
import math
import time
import uuid

from gpt2np import SpeculativeResult

STATS_FIELDS = ("drafter", "policy", "K", "K_counts", "rounds", "drafted", "accepted", "rejections",
                "alpha_hat", "alpha_empirical", "tokens_per_target_call", "target_calls", "draft_calls",
                "target_seconds", "draft_seconds", "calibration_seconds", "probe_seconds", "prompt_overlap",
                "prompt_positions", "prompt_seconds", "c", "v", "predicted_speedup", "predicted_speedup_refined")


def finite(x):
    """JSON has no NaN or infinity: a value that is not a finite number is reported as null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): finite(v) for k, v in x.items()}
    return x


def stats_dict(result):
    """The full statistics of a finished speculative run (None for target-only or a stopped run)."""
    if not isinstance(result, SpeculativeResult):
        return None
    return finite({name: getattr(result.stats, name) for name in STATS_FIELDS})


def batched_stats(generation, live, why="batched"):
    """A drafting job that ran in a packed batch (engine.py), or one a stop string ended: what its own
    rounds measured. A batched job's target passes and draft calls were shared with the other jobs; a
    stopped job's decoder never returned, and the full statistics (SpeculativeStats: calls, seconds,
    c, v) exist only at its end. So the per-job costs and the predictions built on them are null, and
    `why` ("batched" or "stopped") says why.

    K_counts and K mean what SpeculativeStats' do: rounds by the K asked for, clamped to the tokens
    still wanted minus one (K 8 with 7 tokens to go counts as 6; a tree round: the nodes it drafted),
    and the K used most (ties: the larger). Both are null where the engine cannot know that K: prompt
    lookup with a K policy, which may propose fewer drafts than the policy asked for (jobs.counted_K);
    each round's drafts proposed are in `rounds`, and `drafted` sums them."""
    if generation.drafter is None or live is None:
        return None
    own = {name: live[name] for name in STATS_FIELDS if name in live}
    K_counts = live["K_counts"]  # in SpeculativeStats' meaning (jobs.counted_K), or None: not known
    K = max(K_counts, key=lambda k: (K_counts[k], k)) if K_counts else None  # as run_stats.summarise picks it
    policy = ("auto tree" if generation.tree == "auto" else "fixed" if generation.tree is not None  # as the
              else generation.K if isinstance(generation.K, str) else "fixed")                   # policies' names
    return finite({**dict.fromkeys(STATS_FIELDS), **own, "drafter": generation.drafter, "K": K, "K_counts": K_counts,
                   "policy": policy, why: True})


class StopText:
    """Text released as it streams, stopping before the first stop string.

    A stop string can straddle two rounds, so the last len(longest stop) - 1 characters are held
    back until the next round shows they do not start one. Without stop strings nothing is held.
    """

    def __init__(self, stops):
        self.stops, self.hold = tuple(stops), max((len(s) for s in stops), default=1) - 1
        self.text, self.sent, self.stopped = "", 0, False

    def add(self, piece):
        """Append piece; return the text newly safe to send (nothing once a stop string was seen, even
        from later tokens of the same round)."""
        if self.stopped:
            return ""
        self.text += piece
        hits = [i for i in (self.text.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.text, self.stopped = self.text[:min(hits)], True
            return self.flush()
        end = max(self.sent, len(self.text) - self.hold)
        new, self.sent = self.text[self.sent:end], end
        return new

    def flush(self):
        new, self.sent = self.text[self.sent:], len(self.text)
        return new


def token_entries(event, pieces):
    """Per token: id, text and provenance (the playground colours by it)."""
    return [{"id": int(t), "text": s, "provenance": p} for t, s, p in zip(event.tokens, pieces, event.provenance)]


def round_entry(event):
    entry = {"K": event.K, "drafts": [int(x) for x in event.drafts], "decisions": list(event.decisions),
             "n_emitted": event.n_emitted, "seconds": event.seconds}
    if len(set(event.parents)) < len(event.parents):  # a tree round: a node with two or more children
        entry.update(parents=list(event.parents), path=[int(n) for n in event.path])
    return entry


class Completion:
    """One request's completion, built up round by round; chunk() and final() give OpenAI objects."""

    def __init__(self, model_id, generation, prompt_tokens, stops=(), index=0, id=None, several=False):
        """index: its place among the request's choices (choices[].index); id: the request's completion id,
        shared by the completions of one request's choices (None: a new one); several: one choice of a list
        of prompts or of n: its own usage goes in its gpt2np object, OpenAI's usage is the request's."""
        self.id, self.created, self.index, self.several = id or new_id(), int(time.time()), index, several
        self.model_id, self.generation, self.prompt_tokens = model_id, generation, prompt_tokens
        self.text, self.stop = StopText(stops), bool(stops)
        self.tokens, self.provenance, self.entries, self.rounds = [], [], [], []
        self.live, self.stats, self.finish_reason, self.eot = None, None, None, None

    def add_round(self, event, pieces, live, eot_id):
        """Take one round; returns (new text, this round's token entries). A round that completes a stop
        string keeps its tokens up to the one whose text completed it: the tokens, provenance and
        usage are the same whether rounds bring one token (plain) or several (speculative)."""
        new, kept = "", len(pieces)
        for i, piece in enumerate(pieces):
            new += self.text.add(piece)
            if self.text.stopped:
                kept = i + 1
                break
        entries = token_entries(event, pieces)[:kept]
        self.tokens += event.tokens[:kept]
        self.provenance += event.provenance[:kept]
        self.entries += entries
        self.rounds.append(round_entry(event))  # the round as it ran (its drafts, decisions, n_emitted)
        self.live = live
        if self.text.stopped:
            self.finish_reason = "stop"
            self.stats = batched_stats(self.generation, live, "stopped")
        elif eot_id in event.tokens:
            self.finish_reason = "stop"
        return new, entries

    def finish(self, result, tail, live):
        """The stream ended by itself: what is left of the text (held back or an unfinished character)."""
        self.live, self.stats = live, stats_dict(result) or batched_stats(self.generation, live)
        if self.finish_reason is None:
            self.finish_reason = "length" if len(self.tokens) >= self.generation.max_tokens else "stop"
        return self.text.add(tail) + self.text.flush()

    @property
    def done(self):
        return self.text.stopped

    def usage(self):
        return usage_of([self])

    def extension(self, **extra):
        """gpt2np's object: how the completion was decoded. A tree run drafts by its tree, not by K: its K
        is null (each round's K, the nodes it drafted, is in the rounds)."""
        g = self.generation
        return {"speculative": g.drafter is not None, "drafter": g.drafter,
                "K": g.K if g.drafter and g.tree is None else None,
                "tree": list(g.tree) if isinstance(g.tree, tuple) else g.tree, "seed": g.seed, "live": self.live,
                **extra}

    def chunk(self, text, entries, round_):
        """One streamed event: the new text and the round's tokens with their provenance."""
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model_id,
                "choices": [{"text": text, "index": self.index, "logprobs": None, "finish_reason": None}],
                "gpt2np": self.extension(tokens=entries, round=round_)}

    def last_chunk(self, text, entries=None):
        """The closing event: finish_reason, usage and the full statistics; entries: the tokens of the
        round it closes, when a stop string ended that round (its tokens are sent nowhere else)."""
        body = self.final()
        body["choices"][0]["text"] = text
        if self.several:  # OpenAI's usage is the request's: its include_usage event, or nothing
            body["usage"] = None
        body["gpt2np"].pop("rounds")
        if entries is None:
            body["gpt2np"].pop("tokens")
        else:
            body["gpt2np"]["tokens"] = entries
        return body

    def final(self):
        """The whole completion (non-streaming), with every token and round."""
        own = {"usage": self.usage()} if self.several else {}
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model_id,
                "choices": [{"text": self.text.text, "index": self.index, "logprobs": None,
                             "finish_reason": self.finish_reason}],
                "usage": self.usage(),
                "gpt2np": self.extension(tokens=self.entries, rounds=self.rounds, stats=self.stats, **own)}


def new_id():
    return f"cmpl-{uuid.uuid4().hex}"


def final_of(completions, n=1):
    """The answer to a request (non-streaming): one prompt, that completion's own (final); a list of prompts
    (even of one) or n choices of each: one choice each, in OpenAI's order, gpt2np's object of each choice
    (with its own usage) in a list in the same order, and the request's usage (usage_of)."""
    if not completions[0].several:
        return completions[0].final()
    bodies = [c.final() for c in completions]
    return {**bodies[0], "choices": [b["choices"][0] for b in bodies], "usage": usage_of(completions, n),
            "gpt2np": [b["gpt2np"] for b in bodies]}


def usage_of(completions, n=1):
    """A request's usage, as OpenAI counts it: each prompt's tokens once (not n times), every choice's tokens."""
    prompt = sum(c.prompt_tokens for c in completions[::n])
    completion = sum(len(c.tokens) for c in completions)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def usage_chunk_of(completions, n=1):
    """stream_options include_usage's last event (OpenAI's): no choices, the request's usage (usage_of)."""
    first = completions[0]
    return {"id": first.id, "object": "text_completion", "created": first.created, "model": first.model_id,
            "choices": [], "usage": usage_of(completions, n)}


def sse(payload):
    """One server-sent event: `data: <json>` and a blank line."""
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"
