"""Long inputs: attention in blocks (model/fast/blocked_attention.py), row blocks on both cores
(model/fast/threads.py), and the last layer of a prefill computing only the rows whose logits are
wanted (model/forward.py).

Each fast path is checked against the plain one it replaces, with the thresholds that choose it
lowered so that tiny shapes take it; mismatches print their size. Timing: `python -m bench`.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import random_params
from gpt2np.model.fast import blocked_attention as attn
from gpt2np.model import forward as model_module
from gpt2np.model.fast import threads
from gpt2np.model.config import GPT2Config
from gpt2np.model.forward import GPT2, attention, causal_mask, layer_norm
from gpt2np.model.reference import gpt2_reference

CONFIG = GPT2Config(n_vocab=61, n_ctx=96, n_embd=32, n_head=4, n_layer=3)


def max_error(got, want):
    return float(np.abs(np.asarray(got) - np.asarray(want)).max())


@given(n_head=st.integers(1, 5), n_seq=st.integers(1, 40), n_past=st.integers(0, 30),
       d_head=st.sampled_from([4, 8, 64]), n_threads=st.sampled_from([1, 2, 3]),
       query_block=st.integers(1, 16), score_bytes=st.sampled_from([64, 4096, 1 << 20]))
@settings(max_examples=150, deadline=None)
def test_blocks_equal_plain_attention(n_head, n_seq, n_past, d_head, n_threads, query_block, score_bytes):
    rng = np.random.default_rng(n_head * 1000 + n_seq * 10 + n_past)
    n_kv = n_past + n_seq
    q = rng.standard_normal((n_head, n_seq, d_head), dtype=np.float32) * 2
    k, v = (rng.standard_normal((n_head, n_kv, d_head), dtype=np.float32) for _ in range(2))
    want = attention(q, k, v, causal_mask(n_seq, n_kv))
    before = attn.QUERY_BLOCK, attn.SCORE_BYTES
    attn.QUERY_BLOCK, attn.SCORE_BYTES = query_block, score_bytes  # many tasks, of every kind
    try:
        got = attn.attention_in_blocks(q, k, v, n_threads)
    finally:
        attn.QUERY_BLOCK, attn.SCORE_BYTES = before
    assert got.shape == want.shape and got.dtype == np.float32
    err = max_error(got, want)
    # the same sums in another order (and the division after the product with v): measured <= 6e-7
    assert err <= 1e-5, f"max |blocks - plain attention| = {err:.2e}"


@given(n_head=st.integers(1, 40), n_seq=st.integers(1, 300), n_past=st.integers(0, 700),
       n_threads=st.integers(1, 4))
@settings(max_examples=200, deadline=None)
def test_tasks_cover_every_head_and_query_once(n_head, n_seq, n_past, n_threads):
    covered = np.zeros((n_head, n_seq), np.int8)
    for h0, h1, i0, i1 in attn.tasks(n_head, n_seq, n_past + n_seq, n_threads):
        covered[h0:h1, i0:i1] += 1
    assert (covered == 1).all(), f"{(covered != 1).sum()} (head, query) pairs covered other than once"


def test_a_future_key_cannot_leak_into_a_block():
    """Changing the keys and values after a query's position leaves that query's output as it was."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 20, 8), dtype=np.float32) for _ in range(3))
    out = attn.attention_in_blocks(q, k, v, 2)
    k2, v2 = k.copy(), v.copy()
    k2[:, 12:] += 100.0
    v2[:, 12:] -= 50.0
    again = attn.attention_in_blocks(q, k2, v2, 2)
    np.testing.assert_array_equal(again[:, :12], out[:, :12])
    assert max_error(again[:, 12:], out[:, 12:]) > 1.0  # the later queries do see the change


@given(rows=st.integers(1, 200), width=st.integers(1, 70), block_bytes=st.integers(1, 3000))
@settings(max_examples=100, deadline=None)
def test_row_blocks_cover_each_row_once(rows, width, block_bytes):
    before = threads.ROW_BLOCK_BYTES
    threads.ROW_BLOCK_BYTES = block_bytes
    try:
        blocks = threads.row_blocks(np.zeros((rows, width), np.float32))
    finally:
        threads.ROW_BLOCK_BYTES = before
    covered = np.zeros(rows, np.int8)
    for r0, r1 in blocks:
        covered[r0:r1] += 1
    assert (covered == 1).all()


@pytest.fixture
def always_in_blocks(monkeypatch):
    """Every attention in blocks, every row-wise step in blocks of 3 rows on 2 threads."""
    monkeypatch.setattr(model_module, "BLOCKS_MIN_SCORES", 0)
    monkeypatch.setattr(threads, "ROWS_MIN_BYTES", 0)
    monkeypatch.setattr(threads, "ROW_BLOCK_BYTES", 3 * CONFIG.n_embd * 4)
    monkeypatch.setattr(threads, "threads_allowed", lambda: 2)
    monkeypatch.setattr(model_module, "threads_allowed", lambda: 2)


def test_layer_norm_and_linear_in_row_blocks_equal_one_block(always_in_blocks):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((17, CONFIG.n_embd), dtype=np.float32)
    g, b = rng.standard_normal((2, CONFIG.n_embd), dtype=np.float32)
    np.testing.assert_array_equal(layer_norm(x, g, b), layer_norm.__wrapped__(x, g, b))
    w = rng.standard_normal((CONFIG.n_embd, 40), dtype=np.float32)
    bias, residual = rng.standard_normal(40, dtype=np.float32), rng.standard_normal((17, 40), dtype=np.float32)
    want = x @ w + bias
    np.testing.assert_array_equal(model_module.linear(x, w, bias, residual=residual), want + residual)
    np.testing.assert_array_equal(model_module.linear(x, w, bias, activation=model_module.gelu),
                                  model_module.gelu(want))


@pytest.fixture(scope="module")
def model():
    return GPT2(CONFIG, random_params(CONFIG, seed=3))


@pytest.mark.parametrize("n_prompt, n_logits", [(40, 1), (40, 7), (1, 1), (90, 90)])
def test_prefill_in_blocks_equals_the_slow_reference(model, always_in_blocks, n_prompt, n_logits):
    ids = np.random.default_rng(n_prompt).integers(0, CONFIG.n_vocab, n_prompt)
    logits = model.forward(ids, model.new_cache(), n_logits=n_logits)
    slow = gpt2_reference(ids, model.params, CONFIG)[-n_logits:]
    err = max_error(logits, slow)
    assert err <= 1e-4, f"max |fast - reference| = {err:.2e} (logits of magnitude {np.abs(slow).max():.1f})"


def test_a_prefill_asking_for_one_row_caches_what_asking_for_every_row_caches(model):
    """The last layer computes queries, attention and MLP for the wanted rows only, but keys and
    values for all of them: the cache, and every later step, are the same."""
    ids = np.random.default_rng(5).integers(0, CONFIG.n_vocab, 50)
    one, every = model.new_cache(), model.new_cache()
    last = model.forward(ids, one, n_logits=1)
    all_rows = model.forward(ids, every, n_logits=len(ids))
    assert max_error(last, all_rows[-1:]) <= 1e-5
    assert len(one) == len(every) == len(ids)
    n = len(ids)
    assert max_error(one.k[:, :, :n], every.k[:, :, :n]) <= 1e-6
    assert max_error(one.v[:, :, :n], every.v[:, :, :n]) <= 1e-6
    step = [7]
    assert max_error(model.forward(step, one), model.forward(step, every)) <= 1e-5


def test_decode_and_verification_after_a_prefill_in_blocks(model, always_in_blocks):
    """The cached path in blocks, fed in uneven pieces, equals one plain forward over everything."""
    ids = np.random.default_rng(9).integers(0, CONFIG.n_vocab, 80)
    cache = model.new_cache()
    got = [model.forward(ids[:50], cache, n_logits=50)]
    for piece in (ids[50:51], ids[51:56], ids[56:80]):
        got.append(model.forward(piece, cache, n_logits=len(piece)))
    want = gpt2_reference(ids, model.params, CONFIG)
    err = max_error(np.concatenate(got), want)
    assert err <= 1e-4, f"max |pieces in blocks - reference| = {err:.2e}"


def test_one_blas_thread_means_no_helper(monkeypatch):
    """main.py --threads 1 (a threadpoolctl limit) keeps all of this on the caller's thread."""
    if threads.BLAS is None:
        pytest.skip("needs NumPy's OpenBLAS and threadpoolctl")
    from threadpoolctl import threadpool_limits
    calls = []
    monkeypatch.setattr(threads, "helpers", lambda n: calls.append(n) or [])
    with threadpool_limits(limits=1, user_api="blas"):
        assert threads.threads_allowed() == 1
        rng = np.random.default_rng(0)
        q, k, v = (rng.standard_normal((4, 64, 16), dtype=np.float32) for _ in range(3))
        attn.attention_in_blocks(q, k, v, threads.threads_allowed())
    assert calls == [0]


def test_an_exception_in_a_shared_task_reaches_the_caller():
    def work(task):
        if task == 3:
            raise ZeroDivisionError(f"task {task}")
    with pytest.raises(ZeroDivisionError, match="task 3"):
        threads.share(work, range(6), 2)
    done = []
    threads.share(done.append, range(50), 2)
    assert sorted(done) == list(range(50))
