"""Request bodies, checked by pydantic before anything reaches the engine.

OpenAI's completions fields (https://platform.openai.com/docs/api-reference/completions) keep their
names and meanings; gpt2np's own fields (K, K_max, top_k, drafter, speculative) sit beside them,
as vLLM's extra sampling fields do. Types are strict: "5" is not a number and true is not 1, so a
client's mistake is named instead of guessed at. Unknown fields are ignored (clients send `user`
and the like). Limits that depend on the model (context length, token ids) are engine.py's.
"""
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator

Float = Annotated[float, Field(strict=True)]  # strict float still takes ints (1 means 1.0)
MIN_TEMPERATURE = 1e-6  # below it (but above 0) logits / t overflow float64 for subnormal t: NaN probabilities
TokenIds = list[Annotated[StrictInt, Field(ge=0)]]

# what a field must be, for errors pydantic reports once per branch of a union
FIELD_HELP = {
    "prompt": "must be a string or a list of token ids (integers >= 0)",
    "K": "must be an integer from 1 to 32, 'heuristic' or 'auto'",
    "stop": "must be a string or a list of at most 4 non-empty strings",
}


class SamplingFields(BaseModel):
    """Sampling and speculative-decoding fields shared by /predict and /v1/completions."""
    model_config = ConfigDict(extra="ignore")

    temperature: Annotated[Float, Field(ge=0, le=100)] = Field(
        1.0, description="0: greedy (argmax); otherwise logits / temperature")
    top_p: Annotated[Float, Field(gt=0, le=1)] | None = Field(None, description="nucleus sampling, in (0, 1]")
    top_k: Annotated[StrictInt, Field(ge=1)] | None = Field(None, description="keep the k most likely tokens")
    seed: Annotated[StrictInt, Field(ge=0, le=2**63 - 1)] | None = Field(
        None, description="seed of the np.random.Generator (default: a fresh one, reported back)")
    K: Annotated[StrictInt, Field(ge=1, le=32)] | Literal["heuristic", "auto"] = Field(
        4, description="draft tokens per round, or a K policy: 'heuristic' or 'auto'")
    K_max: Annotated[StrictInt, Field(ge=1, le=32)] = Field(8, description="bound of the K policies")
    drafter: StrictStr | None = Field(None, description="one of GET /v1/models' gpt2np.decoding.drafters "
                                                        "(default: the first)")
    speculative: StrictBool = Field(True, description="false: the target alone (for comparison)")


    @model_validator(mode="after")
    def temperature_not_subnormal(self):
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise ValueError(f"temperature: must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, got {self.temperature!r}")
        return self


class PredictRequest(SamplingFields):
    """POST /predict: {"prompt": "..."} and optionally the generation fields."""
    prompt: StrictStr
    max_tokens: Annotated[StrictInt, Field(ge=1)] = 100
    temperature: Annotated[Float, Field(ge=0, le=100)] = 0.0


class CompletionRequest(SamplingFields):
    """POST /v1/completions, OpenAI's legacy completions API (one prompt, one choice)."""
    model: StrictStr | None = Field(None, description="must be the served model's id (GET /v1/models)")
    prompt: StrictStr | Annotated[TokenIds, Field(min_length=1)]
    max_tokens: Annotated[StrictInt, Field(ge=1)] = Field(
        description="required: new tokens at most (fewer if <|endoftext|> or a stop string comes first)")
    stop: StrictStr | Annotated[list[Annotated[StrictStr, Field(min_length=1)]], Field(max_length=4)] | None = None
    stream: StrictBool = False
    stream_options: dict | None = None
    n: Annotated[StrictInt, Field(ge=1, le=1)] = 1
    echo: StrictBool = False
    logprobs: None = None
    best_of: Annotated[StrictInt, Field(ge=1, le=1)] | None = None
    suffix: None = None

    @model_validator(mode="after")
    def unsupported(self):
        if self.echo:
            raise ValueError("echo: not supported by this server")
        if self.stop == "":
            raise ValueError("stop: must not be empty")
        return self

    def stops(self):
        return () if self.stop is None else (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
