"""Decoding: logits -> tokens, one at a time or speculatively (Leviathan et al. 2023; Chen et al. 2023).

    sampling.py            logits -> a distribution (temperature, top-k, top-p; greedy is argmax) -> a token
    autoregressive.py      plain decoding: generate, plain_stream
    speculative_kernel.py  one verification round: modified rejection sampling, the papers' algorithm
    speculative.py         the speculative loop: drafter, K policy, target cache, provenance, the stream
    drafters.py            what proposes tokens: a draft model, prompt lookup
    policies.py            how many tokens to propose: fixed K, the heuristic, auto
    stream.py              generation as a stream of rounds (RoundEvent, Stream)
    stopwatch.py           a model with a stopwatch per call size, for c and v
    run_stats.py           a speculative run's statistics: alpha, c, v, the predictions
    theory.py              alpha, expected tokens per round, the predicted speedup (Thm 3.8, refined)
    tree_drafts.py         token trees of drafts: drawn level by level, with or without replacement; tries
    tree_drafters.py       the loop's tree drafters: a draft model's tree, one call a level; prompt lookup's trie
    tree_kernel.py         one round of token-tree verification: multi-draft speculative sampling
    tree_shape.py          which tree: the shape with the most expected tokens per unit of cost, from v(M)
    tree_policy.py         tree="auto": each round's shape from the run's acceptance and the machine's costs
    batched.py             several prompts decoded together, one packed pass a step
    batched_speculative.py several prompts drafted and verified together; batch_policy.py: K for a batch
    continuous.py          sequences joining and leaving a running batch; continuous_speculative.py: drafting

May import: the model (its interface and token checks). Never checkpoints (files, downloads),
teach, the console or the server.
"""
