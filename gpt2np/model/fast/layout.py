"""The weights' memory order: column-major as stored, or another order for a model that decodes batches.

weights.py stores every Conv1D weight of 2 MiB and more column-major (each output's weights
contiguous), the order matmul.py's few-row methods need: SkylakeX's `pieces` cuts w's columns, and
under the Haswell kernels `rows` streams column blocks. A model that decodes batches multiplies 8 or
more rows at a time, and there the Haswell kernels' plain sgemm packs a row-major w much faster:

    random 355M, Haswell kernels, one forward pass over M new rows at context 128 (ms, alternated):
    M          1      2      4      7      8      9     16
    stored    52.3   76.1  108.4  142.4  150.0  158.3  206.9
    row-major 55.5   83.6  107.2  153.3  123.6  144.7  176.6

Under SkylakeX a model is loaded in panels (order_as_loaded, matmul.LOADED_LAYOUT; matmul.by_panels: w's
columns in contiguous panels of 32, a 3-D array [n / 32, k, 32], which OpenBLAS's small-matrix kernel
streams for several rows at nearly one row's cost): random 355M on a Zen 4 EPYC, a packed decode step of
8 sequences 0.79x its cost on the stored order, of 2 sequences 0.80x, of one 0.99x; a verification pass
over 5 rows 1.28 one-token passes against 1.52.

So the order is the workload's choice, by kernel (matmul.BATCH_LAYOUT): the server, which runs up to
--max_batch sequences in one pass, asks order_for_batches(model) (under SkylakeX its models are in
panels already); a chain's few rows, the console and main.py keep the order they were loaded in.
The numbers stay x @ w's up to float32 rounding either way (matmul.py's methods read every order).
"""
import numpy as np

from .matmul import PANEL, batch_layout, from_panels, loaded_layout, stored_column_major, to_panels, weight_shape

ORDERS = ("column-major", "row-major", "panels")


def conv1d_weights(params):  # -> [(node, key)] for every block's Conv1D weight w
    """Where the blocks' Conv1D weights sit in params (not the tied head: wte's rows are also the
    embedding table, so its order stays)."""
    return [(block[part][name], "w") for block in params["blocks"]
            for part, name in (("attn", "c_attn"), ("attn", "c_proj"), ("mlp", "c_fc"), ("mlp", "c_proj"))]


def all_small(params):  # -> bool
    """Whether every weight product of the model, the tied head's wte.T included, is over a small weight
    (matmul's "small": under 2 MiB, kept row-major, in the core's cache, plain x @ w past a few rows: no
    edge where few-row methods end and each row starts to cost its full share; the bundled models). Every
    GPT-2 release has large ones (batch_policy.BatchAutoK's few_rows)."""
    weights = [node[key] for node, key in conv1d_weights(params)] + [params["wte"].T]
    return not any(stored_column_major(weight_shape(w)) for w in weights)


def weights_order(model):  # -> "column-major" | "row-major" | "panels"
    """The order of model's Conv1D weights (the large ones': a model with none, as the bundled ones, is
    row-major throughout)."""
    large = next((node[key] for node, key in conv1d_weights(model.params)
                  if stored_column_major(weight_shape(node[key]))), None)
    if large is not None and large.ndim == 3:
        return "panels"
    return "column-major" if large is not None and large.T.flags.c_contiguous else "row-major"


def panels_fit(model):  # -> bool
    """Whether model's weights cut into panels: n_embd a multiple of PANEL (then so are c_attn's q, k and
    v blocks and the MLP's 4 n_embd). Every GPT-2 release's is (768, 1024, 1280, 1600)."""
    return model.config.n_embd % PANEL == 0


def fitting(order, model):  # -> order, or "column-major" (as stored) where model's weights do not cut into panels
    return "column-major" if order == "panels" and not panels_fit(model) else order


def set_weights_order(model, order):  # -> model, its large Conv1D weights now in `order`
    """Copy each large Conv1D weight into `order`, in place, one weight at a time (each old array is
    freed as its copy replaces it: at 1558M a second copy of every weight at once would take 6 GB).
    Weights already in that order are not copied; small ones stay row-major (matmul.py's "small")."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
    if order == "panels" and not panels_fit(model):
        raise ValueError(f"panels need n_embd a multiple of {PANEL}, got {model.config.n_embd}")
    convert = {"row-major": np.ascontiguousarray, "column-major": np.asfortranarray}.get(order)
    for node, key in conv1d_weights(model.params):
        w = node[key]
        if not stored_column_major(weight_shape(w)):
            continue                                          # small: row-major in every order
        if order == "panels":
            node[key] = w if w.ndim == 3 else to_panels(w)    # [k, n] -> [n / PANEL, k, PANEL]
        else:                                                 # no copy where w is already in that order
            node[key] = convert(from_panels(w) if w.ndim == 3 else w)
    return model


def order_for_batches(model, kernel=None):  # -> the order model's large weights now have
    """Give model the order matmul.BATCH_LAYOUT names for this BLAS kernel (default: the running one)
    for decoding batches: row-major under Haswell and Zen, panels under SkylakeX (where the model's
    n_embd allows them, else the stored column-major), the stored column-major elsewhere."""
    set_weights_order(model, fitting(batch_layout(kernel), model))
    return weights_order(model)


def order_as_loaded(model, kernel=None):  # -> model, its large weights in the order loaded models take
    """Give model the order matmul.LOADED_LAYOUT names for this BLAS kernel (default: the running one):
    panels under SkylakeX where the model's n_embd allows them, as stored (column-major) elsewhere.
    load_model and random_model call it, so every model that decodes gets it."""
    return set_weights_order(model, fitting(loaded_layout(kernel), model))
