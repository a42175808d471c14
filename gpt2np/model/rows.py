"""Rows with explicit positions and an attention scope: one forward pass over a token tree (and, later,
over several sequences packed together).

A plain forward call feeds n_seq new tokens that follow the cache: row i sits at position
n_past + i and sees the cached prefix and rows 0..i (the causal mask). Token-tree verification
(SpecInfer, Miao et al. 2024, "tree-based parallel decoding"; Medusa, Cai et al. 2024, "tree
attention") breaks both rules: a tree's nodes are flattened into rows, and a node at depth d sits
at position n_past + d and sees only the prefix, its ancestors and itself. So a call is described
by three arrays, which are all a forward pass needs to know:

    ids        [n_seq]          the new rows' tokens
    positions  [n_seq]          each row's position (its wpe row): n_past + depth for a tree
    scope      [n_seq, n_seq]   bool, scope[i, j]: row i sees new row j (its ancestors and itself);
                                every row also sees the whole cached prefix

Every row's key and value are written to the cache in row order, at n_past .. n_past + n_seq - 1,
whatever their positions (the position lives in the key through wpe, not in the slot). The chain is
the special case (consecutive positions, lower-triangular scope: `chain_scope`) and keeps its own
code, GPT2.forward, untouched (with blocked attention for long inputs); GPT2.forward_rows with
`chain_scope` gives the same numbers bit for bit below that size (tests/model/test_tree_forward.py).

A scope may also reach back into the cache. With n_shared < n_past, only the first n_shared cached
positions are seen by every row, and scope has a column for each cached row after them, then one
for each new row: [n_seq, n_past - n_shared + n_seq]. A draft model growing a tree one level per
call needs it: level d's rows see the context (shared) and, among the rows of the levels before,
which are in its cache already, only their own ancestors (`tree_scope_for`).

After a tree pass the cache holds every node; `KVCache.keep_rows(n_past, path)` compacts the
accepted root-to-node path to n_past, n_past + 1, ..., where a plain forward of that path would
have put it. Only a path may be kept this way: its depths are 0, 1, 2, ..., so after compaction each
row's slot is again its position, which is what the next plain call assumes.

Several sequences at once (the batching issue) use the same three arrays. Pack the sequences' new
rows one after the other; `packed_scope` makes the scope block-diagonal (a row never sees another
sequence's rows) and each row keeps its own sequence's position. Only the prefix differs: each
sequence has its own cache, so the forward pass takes one cache per block of rows, runs every
product over all Σ n_i rows at once, and runs attention block by block, each block exactly this
module's single-cache attention (`scope_mask(scope[block, block], len(cache_i))`; short blocks share
their scale, mask and exponentials in one padded array, the same numbers: batch.attention_together). A
sequence that verifies a tree inside a batch is a block whose scope is `tree_scope`. Sequences that
share a prefix can share one cache outright: two continuations of one prompt packed in one call over its
cache each get their own logits (tested).

>>> parents = [-1, 0, 0, 1]            # root, two children, a grandchild under the first child
>>> tree_positions(parents, n_past=5).tolist()
[5, 6, 6, 7]
>>> tree_scope(parents).astype(int).tolist()
[[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]
"""
import numpy as np

MASKED = -1e10  # the additive mask's "cannot see": forward.causal_mask's value, so the chain matches bit for bit


def check_parents(parents):  # -> [n] int64
    """parents as an array, or a one-line ValueError: node 0 is the root (parent -1), and every other
    node's parent comes before it (0 <= parents[i] < i), so a tree is listed root first, parents
    before children (level order qualifies).

    >>> check_parents([-1, 0, 2])
    Traceback (most recent call last):
    ValueError: a tree's nodes must come after their parents: node 2 has parent 2
    """
    parents = np.asarray(parents)
    if parents.ndim != 1 or len(parents) == 0 or parents.dtype.kind not in "iu":
        raise ValueError(f"parents must be a non-empty 1-D sequence of ints, got {parents!r}")
    if parents[0] != -1:
        raise not_the_root(parents[0])
    bad = np.flatnonzero((parents[1:] < 0) | (parents[1:] >= np.arange(1, len(parents))))
    if len(bad):
        raise before_its_parent(bad[0] + 1, parents[bad[0] + 1])
    return parents.astype(np.int64)


def not_the_root(parent):  # check_parents' and tree_path's errors, worded once
    return ValueError(f"node 0 is the root: its parent must be -1, got {parent}")


def before_its_parent(node, parent):
    return ValueError(f"a tree's nodes must come after their parents: node {node} has parent {parent}")


def tree_depths(parents):  # [n] -> [n]: the root is at depth 0
    parents = check_parents(parents)
    depths = np.zeros(len(parents), np.int64)
    for node in range(1, len(parents)):  # parents come first: their depth is known
        depths[node] = depths[parents[node]] + 1
    return depths


def tree_positions(parents, n_past):  # [n] -> [n]
    """Each node's position: n_past + its depth, where a plain forward of its path would put it."""
    return n_past + tree_depths(parents)


def tree_scope(parents):  # [n] -> [n, n] bool
    """scope[i, j]: node j is node i or one of its ancestors (tree attention: a node sees its own path)."""
    parents = check_parents(parents)
    scope = np.eye(len(parents), dtype=bool)
    for node in range(1, len(parents)):
        scope[node] |= scope[parents[node]]  # the parent's row holds the parent's ancestors and itself
    return scope


def tree_path(parents, node):  # -> [depth + 1] node indices, root first
    """The nodes from the root down to node: the rows KVCache.keep_rows keeps when node is accepted.

    >>> tree_path([-1, 0, 0, 2], 3)
    [0, 2, 3]
    >>> tree_path([-1, 0, 3, 1], 2)
    Traceback (most recent call last):
    ValueError: a tree's nodes must come after their parents: node 2 has parent 3

    Only the nodes on the path are checked (check_parents checks them all, at numpy's cost per call:
    the tree kernels ask for every node's path, and it was a fifth of their tests' time).
    """
    if int(parents[0]) != -1:
        raise not_the_root(parents[0])
    path = [int(node)]
    while path[-1] != 0:
        parent = int(parents[path[-1]])
        if not 0 <= parent < path[-1]:
            raise before_its_parent(path[-1], parent)
        path.append(parent)
    return path[::-1]


def widths_parents(widths):  # (w_1, ..., w_D) -> [1 + w_1 + w_1 w_2 + ...]
    """The parents of the full tree with w_d children under every node at depth d - 1, in level order.

    >>> widths_parents((2, 1)).tolist()   # root; its 2 children; one child under each
    [-1, 0, 0, 1, 2]
    """
    parents, level = [-1], [0]
    for width in widths:
        children = list(range(len(parents), len(parents) + width * len(level)))
        parents += [node for node in level for _ in range(width)]
        level = children
    return np.array(parents, dtype=np.int64)


def chain_parents(n):  # -> [n]: each node the child of the one before (a plain chain of tokens)
    return np.arange(-1, n - 1)


def chain_scope(n):  # -> [n, n] bool, lower triangular: what forward.causal_mask says with booleans
    return np.tri(n, dtype=bool)


def trunk_and_tree(parents, n_trunk):  # [n] -> [n_trunk - 1 + n]
    """Parents for rows that start with a chain of n_trunk tokens whose last one is the tree's root.

    A verification call feeds the tokens the cache lacks (one, the newest, between rounds; the whole
    prompt in the first round) and the tree under the newest: that is one tree, a trunk then branches.

    >>> trunk_and_tree([-1, 0, 0], n_trunk=3).tolist()
    [-1, 0, 1, 2, 2]
    """
    parents = check_parents(parents)
    if n_trunk < 1:
        raise ValueError(f"the trunk holds at least the root, got n_trunk={n_trunk}")
    return np.concatenate([chain_parents(n_trunk), parents[1:] + (n_trunk - 1)])


def packed_scope(scopes):  # [n_i, n_i] each -> [sum n_i, sum n_i] bool, block diagonal
    """Several sequences' scopes packed one after the other: no row sees another sequence's rows.

    >>> packed_scope([chain_scope(2), tree_scope([-1, 0, 0])]).astype(int).tolist()[3]
    [0, 0, 1, 1, 0]
    """
    sizes = [len(s) for s in scopes]
    packed = np.zeros((sum(sizes), sum(sizes)), dtype=bool)
    starts = np.cumsum([0] + sizes)
    for start, scope in zip(starts, scopes):
        packed[start:start + len(scope), start:start + len(scope)] = scope
    return packed


def tree_scope_for(parents, cached, new):  # -> [len(new), len(cached) + len(new)] bool
    """The scope of a call that feeds the tree's nodes `new` after the nodes `cached` (in the cache's
    row order, after the shared positions): each new node sees its ancestors among both, and itself.

    >>> tree_scope_for([-1, 0, 0, 1, 2], cached=[1, 2], new=[3, 4]).astype(int).tolist()
    [[1, 0, 1, 0], [0, 1, 0, 1]]
    """
    return tree_scope(parents)[np.ix_(list(new), list(cached) + list(new))]


def check_scope(scope, n_seq, n_cached=0):  # -> [n_seq, n_cached + n_seq] bool
    """scope as a boolean array, or a one-line ValueError: [n_seq, n_cached + n_seq] (n_cached: the
    cached rows after the shared positions), and every row sees itself (a row that saw nothing new
    and no prefix would average nothing: softmax of only masked scores)."""
    scope = np.asarray(scope)
    if scope.shape != (n_seq, n_cached + n_seq) or scope.dtype != bool:
        raise ValueError(f"scope must be a bool array [n_seq, cached rows not shared + n_seq] = "
                         f"[{n_seq}, {n_cached + n_seq}], got {scope.dtype} {scope.shape}")
    itself = scope[:, n_cached:].diagonal()
    if not itself.all():
        raise ValueError(f"every row must see itself: row i does not, for i = {np.flatnonzero(~itself)[:3].tolist()}")
    return scope


def check_rows(positions, scope, n_seq, n_ctx, n_past, n_shared=None):  # -> positions, scope, n_shared
    """A rows call's layout, checked (one-line ValueErrors): one integer position in [0, n_ctx) per
    row, n_shared (default n_past) an integer in [0, n_past], and the scope (check_scope)."""
    positions = np.asarray(positions)
    if positions.shape != (n_seq,) or (n_seq and positions.dtype.kind not in "iu"):
        raise ValueError(f"need one integer position per row: positions {positions.dtype} "
                         f"{positions.shape} for {n_seq} rows")
    if ((positions < 0) | (positions >= n_ctx)).any():
        raise ValueError(f"positions must be in [0, {n_ctx}), got {positions.min()}..{positions.max()}")
    n_shared = n_past if n_shared is None else n_shared
    if isinstance(n_shared, bool) or not isinstance(n_shared, (int, np.integer)) or not 0 <= n_shared <= n_past:
        raise ValueError(f"n_shared must be an integer in [0, {n_past}] (cached positions), got {n_shared!r}")
    return positions, check_scope(scope, n_seq, n_past - n_shared), int(n_shared)


def scope_mask(scope, n_shared):  # [n_seq, n_kv - n_shared] bool -> [n_seq, n_kv] float32, additive
    """The additive attention mask of a rows call: 0 over the first n_shared cached positions (every
    row sees them) and where scope is True, MASKED elsewhere. With chain_scope and every cached
    position shared, this is forward.causal_mask, value for value.

    >>> scope_mask(np.array([[True, False], [False, True]]), n_shared=1).tolist()
    [[0.0, 0.0, -10000000000.0], [0.0, -10000000000.0, 0.0]]
    """
    n_seq, n_scoped = scope.shape
    mask = np.zeros((n_seq, n_shared + n_scoped), np.float32)
    mask[:, n_shared:] = np.where(scope, 0.0, MASKED)
    return mask
