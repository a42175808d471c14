"""Request bodies, checked by pydantic before anything reaches the engine.

OpenAI's completions fields (https://platform.openai.com/docs/api-reference/completions) keep their
names and meanings; gpt2np's own fields (K, K_max, top_k, drafter, speculative) sit beside them,
as vLLM's extra sampling fields do. Types are strict: "5" is not a number and true is not 1, so a
client's mistake is named instead of guessed at. null means "as if left out", as in OpenAI's API.

No field is ever dropped silently. Each one is
  * honoured, under its own name or another repository's name for it (ALIASES: `gamma` for K,
    `max_new_tokens` and `max_length` for max_tokens); two spellings with different values -> 400;
  * refused with a 400 that names it, when it would change the output and is not implemented
    (logprobs, echo, suffix, non-zero penalties, a non-empty logit_bias, best_of other than n);
  * accepted and ignored only where ignoring it cannot change the output (`user`, `suffix: ""`, and the
    drafting fields beside `speculative: false`: a client that toggles speculative sends the same body);
  * or unknown: 400 naming it (extra="forbid").
Limits that depend on the model (context length, token ids) are engine.py's.
"""
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator

from gpt2np import K_MAX_LIMIT
from gpt2np.report import TREE_MAX_NODES, TREE_MAX_WIDTH, tree_nodes
from .engine import RequestError

# strict float still takes ints (1 means 1.0); NaN and infinity (Python's json reads NaN, Infinity) are
# refused as such, before a bound would call NaN "greater than 100"
Float = Annotated[float, Field(strict=True, allow_inf_nan=False)]
MIN_TEMPERATURE = 1e-6  # below it (but above 0) logits / t overflow float64 for subnormal t: NaN probabilities
TokenIds = list[Annotated[StrictInt, Field(ge=0)]]
Prompt = StrictStr | Annotated[TokenIds, Field(min_length=1)]
KValue = Annotated[StrictInt, Field(ge=1, le=K_MAX_LIMIT)] | Literal["heuristic", "auto"]
Count = Annotated[StrictInt, Field(ge=1)]
TreeValue = Annotated[list[Annotated[StrictInt, Field(ge=1, le=TREE_MAX_WIDTH)]], Field(min_length=1, max_length=8)] \
    | Literal["auto"]

# what a field must be: the 400 for any type or range error pydantic finds in it is "<field>: <this>, got
# <the value sent>" (app.validation_message), never pydantic's own wording ("Input should be greater than or
# equal to 0"); the sampling fields are worded as main.py's flags (cli/flags.py: check_sampling_flags)
FIELD_HELP = {
    "prompt": "must be a string, or a list of at least one token id (integers >= 0), or a non-empty list of these "
              "(several prompts, a choice each)",
    "K": "must be an integer from 1 to 32, 'heuristic' or 'auto'",
    "gamma": "must be an integer from 1 to 32, 'heuristic' or 'auto' (gamma is another name of K)",
    "stop": "must be a string or a list of at most 4 non-empty strings",
    "tree": "must be a list of 1 to 8 integers from 1 to 8 (children per depth, e.g. [3, 2, 1], at most 64 nodes "
            "in all) or 'auto'",
    "temperature": "must be a finite number >= 0 (0 means greedy), at most 100",
    "top_p": "must be a finite number in (0, 1] (1, or leaving it out, keeps every token)",
    "top_k": "must be an integer, at least 1 (leave it out to keep every token)",
    "seed": "must be a non-negative integer, below 2**63",
    "K_max": "must be an integer from 1 to 32 (the bound of K 'heuristic' or 'auto' and of tree 'auto')",
    "max_tokens": "must be a positive integer (new tokens at most)",
    "max_new_tokens": "must be a positive integer (another name of max_tokens)",
    "max_length": "must be a positive integer (prompt tokens + new tokens, as in Hugging Face)",
    "speculative": "must be true or false (false: the target alone)",
    "stream": "must be true or false",
    "drafter": "must be one of GET /v1/models' gpt2np.drafters (a non-empty string)",
    "model": "must be a string: the served model's id (GET /v1/models)",
    "user": "must be a string",
    "n": "must be a positive integer (choices a prompt, each its own draws)",
    "best_of": "must be n (the best of more than n needs logprobs, not supported)",
    "echo": "not supported by this server (leave it out, or send false)",
    "suffix": "not supported by this server (leave it out, or send null or \"\")",
    "frequency_penalty": "not supported by this server (leave it out, or send 0)",
    "presence_penalty": "not supported by this server (leave it out, or send 0)",
}
PREDICT_HELP = {**FIELD_HELP, "prompt": "must be a string (POST /v1/completions also takes token ids)"}
EMPTY_PROMPT = ('"" starts from <|endoftext|>, unconditionally, as GPT-2 samples without a prompt: '
                'usage counts it as 1 prompt token')
# other repositories' names for our fields (Leviathan et al.'s gamma; Hugging Face's max_new_tokens);
# max_length (prompt + new tokens, Hugging Face's meaning) needs the prompt's length: new_tokens()
ALIASES = {"gamma": "K", "max_new_tokens": "max_tokens"}
DEFAULT_MAX_TOKENS = 16  # /v1/completions' max_tokens left out, as OpenAI's completions API (and vLLM) default


def unsupported(field, allowed):
    return ValueError(f"{field}: not supported by this server (leave it out, or send {allowed})")


class Strict(BaseModel):
    """Unknown fields are refused; a null is the same as leaving the field out."""
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def null_means_absent(cls, data):
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data


class SamplingFields(Strict):
    """Sampling and speculative-decoding fields shared by /predict and /v1/completions."""
    temperature: Annotated[Float, Field(ge=0, le=100)] = Field(
        1.0, description="0: greedy (argmax); otherwise logits / temperature")
    top_p: Annotated[Float, Field(gt=0, le=1)] | None = Field(None, description="nucleus sampling, in (0, 1]")
    top_k: Annotated[StrictInt, Field(ge=1)] | None = Field(None, description="keep the k most likely tokens")
    seed: Annotated[StrictInt, Field(ge=0, le=2**63 - 1)] | None = Field(
        None, description="seed of the np.random.Generator (default: a fresh one, reported back)")
    K: KValue = Field(4, description="draft tokens per round, or a K policy: 'heuristic' or 'auto'")
    gamma: KValue | None = Field(None, description="another name of K (Leviathan et al.'s)")
    K_max: Annotated[StrictInt, Field(ge=1, le=K_MAX_LIMIT)] = Field(8, description="bound of the K policies")
    tree: TreeValue | None = Field(None, description="draft a token tree each round instead of K drafts: children "
                                                     "per depth ([3, 2, 1]), or 'auto' (each round's shape from the "
                                                     "run's acceptance and measured costs; a draft model only)")
    drafter: Annotated[StrictStr, Field(min_length=1)] | None = Field(
        None, description="one of GET /v1/models' gpt2np.drafters (default: its default_drafter; where that is "
                          "null, --draft_model_size none, the target alone)")
    speculative: StrictBool = Field(True, description="false: the target alone (for comparison)")
    max_tokens: Count | None = Field(None, description="new tokens at most (fewer if <|endoftext|> or a stop "
                                                       "string comes first)")
    max_new_tokens: Count | None = Field(None, description="another name of max_tokens (Hugging Face's)")
    max_length: Count | None = Field(None, description="prompt tokens + max_tokens (Hugging Face's meaning)")

    @model_validator(mode="after")
    def checked(self):
        if self.tree is not None and ({"K", "gamma"} & self.model_fields_set):
            said = "K" if "K" in self.model_fields_set else "gamma"
            raise ValueError(f"tree: a tree fixes each round's drafts: leave {said} out (a tree round's K is the "
                             f"nodes it drafts)")
        if isinstance(self.tree, list) and tree_nodes(self.tree) > TREE_MAX_NODES:
            raise ValueError(f"tree: at most {TREE_MAX_NODES} nodes in all (the rows the loop keeps for a tree; "
                             f"[3, 2, 1] drafts 15), got {self.tree} with {tree_nodes(self.tree)}")
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise ValueError(f"temperature: must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, got {self.temperature!r}")
        for alias, name in ALIASES.items():
            value = getattr(self, alias)
            if value is None:
                continue
            if name in self.model_fields_set and getattr(self, name) != value:
                raise ValueError(f"{alias}: {name} ({getattr(self, name)!r}) and {alias} ({value!r}) are two "
                                 f"names of one field and disagree: send one of them")
            setattr(self, name, value)
        return self

    def max_tokens_name(self, counting_prompt=True):
        """The spelling of max_tokens the request used (for its error messages)."""
        if counting_prompt and self.max_length is not None:
            return "max_length"
        return "max_new_tokens" if self.max_new_tokens is not None else "max_tokens"

    def new_tokens(self, n_prompt):
        """max_tokens, whichever way the request said it; max_length counts the prompt's n_prompt
        tokens too. RequestError when it leaves no room or disagrees with max_tokens."""
        if self.max_length is None:
            return self.max_tokens
        n = self.max_length - n_prompt
        if n < 1:
            raise RequestError("max_length", f"max_length ({self.max_length}) counts the prompt's {n_prompt} "
                                             f"tokens too, as in Hugging Face: it must be more than {n_prompt}")
        if "max_tokens" in self.model_fields_set and self.max_tokens != n:
            name = self.max_tokens_name(counting_prompt=False)
            raise RequestError("max_length", f"max_length ({self.max_length}) and {name} ({self.max_tokens}) "
                                             f"disagree: with the prompt's {n_prompt} tokens, max_length "
                                             f"{self.max_length} means {name} {n}; send one of them")
        return n


class PredictRequest(SamplingFields):
    """POST /predict: {"prompt": "..."} and optionally the generation fields."""
    prompt: StrictStr = Field(description=f"the text to continue ({EMPTY_PROMPT})")
    max_tokens: Count = Field(100, description="new tokens at most")
    temperature: Annotated[Float, Field(ge=0, le=100)] = 0.0


class StreamOptions(Strict):
    include_usage: StrictBool | None = Field(None, description="true: one more event before [DONE], its choices "
                                             "empty, with the request's usage (OpenAI's); a single prompt's last "
                                             "text event carries usage too")


class CompletionRequest(SamplingFields):
    """POST /v1/completions, OpenAI's legacy completions API (one choice a prompt; several prompts in a list)."""
    model: StrictStr | None = Field(None, description="must be the served model's id (GET /v1/models)")
    prompt: Prompt | Annotated[list[Prompt], Field(min_length=1)] = Field(
        description=f"the text to continue, or its token ids ({EMPTY_PROMPT}); or a list of these, several "
                    f"prompts: choices[i] continues prompt i, as the same request with that prompt alone would "
                    f"(a seed seeds each), and they run together in the server's batch")
    max_tokens: Count | None = Field(None, description=f"new tokens at most (fewer if <|endoftext|> or a stop string "
                                     f"comes first); default {DEFAULT_MAX_TOKENS}, as OpenAI's, unless max_new_tokens "
                                     f"or max_length says it")
    stop: StrictStr | Annotated[list[Annotated[StrictStr, Field(min_length=1)]], Field(max_length=4)] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: StrictStr | None = Field(None, description="accepted and ignored (it cannot change the output)")
    n: Count = Field(1, description="choices a prompt, each its own draws: choice j is the request alone with seed "
                                    "+ j where a seed is given, with a fresh seed each otherwise (greedy: n equal texts)")
    best_of: StrictInt | None = Field(None, description="must be n, the default (returning the best of more needs "
                                                         "logprobs)")
    echo: StrictBool = Field(False, description="must be false")
    logprobs: None = Field(None, description="not supported")
    suffix: Literal[""] | None = Field(None, description="not supported (\"\" is: it appends nothing)")
    frequency_penalty: Float = Field(0.0, description="must be 0")
    presence_penalty: Float = Field(0.0, description="must be 0")
    logit_bias: dict[StrictStr, Float] = Field({}, description="must be empty")

    @model_validator(mode="after")
    def supported(self):
        refused = [("best_of", self.best_of not in (None, self.n), "n"), ("echo", self.echo, "false"),
                   ("frequency_penalty", self.frequency_penalty != 0, "0"),
                   ("presence_penalty", self.presence_penalty != 0, "0"),
                   ("logit_bias", bool(self.logit_bias), "{}")]
        for field, asked, allowed in refused:
            if asked:
                raise unsupported(field, allowed)
        if self.seed is not None and self.seed + self.n - 1 > 2**63 - 1:
            raise ValueError(f"seed: choice j of a prompt draws with seed + j, so with n {self.n} the seed must be "
                             f"at most 2**63 - {self.n}")
        if self.stop == "":
            raise ValueError("stop: must not be empty")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only allowed with stream true")
        if self.max_tokens is None and self.max_new_tokens is None and self.max_length is None:
            self.max_tokens = DEFAULT_MAX_TOKENS  # OpenAI's default; the aliases above fill it when sent
        return self

    def listed(self):
        """Whether the prompt is a list of prompts (of strings or of token-id lists), even of one."""
        return isinstance(self.prompt, list) and isinstance(self.prompt[0], (str, list))

    def prompts(self):
        """The request's prompts: one (a string or token ids), or each of a list of them."""
        return list(self.prompt) if self.listed() else [self.prompt]

    def stops(self):
        return () if self.stop is None else (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
