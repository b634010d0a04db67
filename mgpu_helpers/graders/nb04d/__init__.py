"""Used by notebook 04d's exercises: snapshot functions for a full training state with Dropout (04d.1) and
the repair of a training loop that is not restart-safe (04d.2).

Each grader first runs a cheap check that catches the usual mistakes in a second or two, and only code
that passes it goes on to one real **elastic** job: torchelastic's ``LocalElasticAgent`` (what torchrun
runs) with 2 gloo workers, ``--max-restarts=1`` and a c10d rendezvous on 127.0.0.1, in which a worker dies
once. The agent runs in a child of the launcher's forkserver and its workers fork from the agent
(:mod:`~mgpu_helpers.graders._elastic`), so functions defined in the notebook run as they are — no script.

**04d.1.** In the kernel: train 2 epochs of a float64 MLP with Dropout, AdamW and a per-step ``LambdaLR``
on 2 simulated ranks whose global RNGs are seeded differently (the kernel's generator plays rank 0),
``save_snapshot``, build a fresh model, optimizer and scheduler (rank 0's RNG re-seeded, as in a new
process), ``load_snapshot``, train epoch 2, and compare what was loaded (epoch, weights, AdamW's moments,
learning rate, RNG state) and the final weights with the uninterrupted run (``rtol=1e-9``); a second
snapshot, of epoch 6, must load as epoch 7 (the epoch comes from the file, not from the code). Then each
write of one more ``save_snapshot`` in turn writes half its bytes and "dies" (:mod:`._crash`):
``load_snapshot`` must still load a complete snapshot (a non-atomic save fails here). Then the elastic
job: every rank calls ``save_snapshot`` after every epoch, rank 1 dies at the start of epoch 2, both
workers restart and resume; what each rank loaded (its **own** RNG state included: loading rank 0's on
every rank fails) and the final weights are compared with the single-process computation.

**04d.2.** In 2 ranks (:func:`~mgpu_helpers.graders._ranks.run_ranks`): ``train(epochs=4)`` (the
reference), and ``train(epochs=1)`` followed by ``train(epochs=4)`` on the same path with a fresh model (it
must resume at epoch 1 with the reference's batches and weights); in the reference rank 0 must see its half
of the samples once per epoch, in a new order every epoch (no shuffle, or every rank on all the data, is
not the repair). Then the elastic job, where rank 0's
first attempt dies while writing its **second** snapshot, whatever route the write takes (``torch.save``
to the path, or a file opened for writing in the snapshot's folder): half the bytes reach the file, then
``os._exit(1)``. The restarted job must resume from the last complete snapshot, see the reference's
batches and end with its weights.

Both jobs set ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (notebook 04d's Going deeper says why), keep every
store and socket on loopback (:mod:`mgpu_helpers.launching.loopback`), tie the agent to the kernel and the
workers to the agent (``PR_SET_PDEATHSIG``), and stop every process before the grader returns.

Layout: :mod:`.snapshot` (04d.1), :mod:`.restart` (04d.2), :mod:`._crash` (the dying write) and
:mod:`._common` (float64 comparisons both use).
"""

from . import restart, snapshot  # noqa: F401  (importing them registers the graders)
