"""A tiny random target and draft for the bench's forced drafters' tests, and a prompt and the target's greedy
continuation of it."""
import numpy as np

import gpt2np


def tiny_pair(prompt_len, n_tokens):  # -> (target, draft, prompt, continuation)
    target = gpt2np.random_model(gpt2np.GPT2Config(n_vocab=64, n_ctx=128, n_embd=32, n_head=2, n_layer=2), seed=0,
                                 tokenizer=None)
    draft = gpt2np.random_model(gpt2np.GPT2Config(n_vocab=64, n_ctx=128, n_embd=16, n_head=2, n_layer=1), seed=1,
                                tokenizer=None)
    prompt = [int(t) for t in np.random.default_rng(3).integers(0, 64, prompt_len)]
    return target, draft, prompt, gpt2np.generate(target, prompt, n_tokens, temperature=0)
