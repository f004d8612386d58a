"""`linen-nnx compare` of a model description: both implementations, one start, side by side.

The NNX side starts from the Linen parameters and optimizer state, converted
(the two frameworks draw different values from one seed); both then train on
the same batches, and every leaf is compared in Linen's layout.
"""

from __future__ import annotations

import jax

from converters.checkpoint.compare import LeafComparison, compare_linen_states
from linen_nnx_cli.kit_models import correspondence_of_name
from linen_nnx_cli.kit_models import nnx_to_linen_state, start_from_linen
from converters.presets import KIT_PATHS
from kit_mlp.data import make_batches
from kit_mlp.optimizers import make_tx
from linen_impl import train as linen_train
from nnx_impl import train as nnx_train


def compare_description(desc, optimizer: str, steps: int) -> tuple[list[LeafComparison], dict]:
  """Both implementations of `desc` from identical parameters, after `steps` steps.

  The NNX side starts from the Linen parameters and optimizer state,
  converted (the two frameworks draw different values from one seed).
  """
  mesh = desc.make_mesh()
  linen_trainer = linen_train.make_trainer(desc, mesh, make_tx(optimizer))
  nnx_trainer = nnx_train.make_trainer(desc, mesh, optimizer)
  losses = {'linen': [], 'nnx': []}
  with jax.set_mesh(mesh):
    linen_state, arrays = start_from_linen(linen_trainer, nnx_trainer)
    if steps > 0:
      xs, ys = make_batches(desc, mesh, steps, seed=1)
    for step in range(steps):
      linen_state, loss = linen_trainer.train_step(linen_state, xs[step], ys[step])
      losses['linen'].append(float(loss))
      arrays, loss = nnx_trainer.train_step(arrays, xs[step], ys[step])
      losses['nnx'].append(float(loss))
    nnx_as_linen = nnx_to_linen_state(nnx_trainer.to_state(arrays), nnx_trainer, linen_trainer, None, None)
    rows = compare_linen_states(
        linen_state, nnx_as_linen, KIT_PATHS, correspondence_of_name(optimizer)
    )
  extra = {'description': repr(desc), 'optimizer': optimizer, 'steps': steps, 'losses': losses}
  return rows, extra
