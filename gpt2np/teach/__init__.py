"""Teaching: the experiments and show-your-work helpers of the classroom and the notebooks.

    classroom.py            python -m gpt2np.classroom: target vs speculative frequencies, and broken samplers
    exact.py                exact enumeration of every random path of a small speculative run
    chi_square.py           chi-square goodness of fit from scratch (no scipy at runtime)
    toy_models.py           tiny n-gram models with the model interface
    broken_kernels.py       deliberately wrong samplers: the negative controls
    broken_tree_kernels.py  deliberately wrong token-tree kernels: the tree kernel's negative controls
    broken_batch_kernels.py deliberately wrong batched speculative decoding: the batch's negative controls
    explain.py              the forward pass step by step with every intermediate, for the notebooks
    blas_curves.py          what M rows cost against one, per OpenBLAS kernel, for notebook 07 and the bench
    policy_simulation.py    a K policy against a cost model: many coin seeds in a second, no model, no clock
    batch_simulation.py     the batch's K policy against scripted costs and noisy readings: seeds in seconds
    tree_simulation.py      tree="auto" against a cost model and the bench's per-rank coins: seeds in a second

May import every layer below. Imported only by notebooks, tests, the bench and the classroom command.
"""
