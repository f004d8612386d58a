"""`linen-nnx demo`: the Linen and NNX MLPs side by side on one mesh.

Prints the mesh and a table of every parameter with its path, shape and
PartitionSpec on both sides. Then converts a new Linen `TrainState` to NNX
(`linen_nnx_cli.kit_models.start_from_linen`), shows how one weight is laid out over
the devices on each side (`jax.debug.visualize_array_sharding`), trains both
on the same batches and prints their losses step by step: they are identical,
bit for bit. Both loss curves go to a PNG when matplotlib (the plot extra) is
installed.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from linen_nnx_cli.kit_models import start_from_linen
from converters.paths import format_path
from converters.presets import KIT_PATHS
from converters.linen_trees import read_collection
from kit_mlp.data import make_batches
from kit_mlp.description import ModelDescription
from kit_mlp.optimizers import make_tx
from linen_impl import train as linen_train
from linen_nnx_cli.plot import INSTALL_HINT, plot_losses
from linen_nnx_cli.tables import print_table
from nnx_impl import train as nnx_train


def _get(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def describe_mesh(mesh) -> str:
  ids = np.vectorize(lambda d: d.id)(mesh.devices)
  sizes = ' x '.join(f'{n}={s}' for n, s in mesh.shape.items())
  grid = '\n'.join('  ' + ' '.join(f'{i:2d}' for i in row) for row in ids)
  platform = mesh.devices.flat[0].platform
  return f'Mesh {sizes} over {mesh.size} {platform} devices (device ids):\n{grid}'


def parameter_rows(desc, mesh, linen_trainer, nnx_trainer) -> tuple[list[str], list[list[str]]]:
  """Header and rows: each parameter's Linen and NNX path, shape and specs."""
  linen_specs = {'params': linen_trainer.sharding.params}
  with jax.set_mesh(mesh):
    nnx_specs = nnx.get_partition_spec(nnx_trainer.abstract_state)
  rows = []
  linen_paths = [
      tuple(k.key for k in path)
      for path, _ in jax.tree_util.tree_flatten_with_path(linen_specs['params'])[0]
  ]
  for linen_path, match in KIT_PATHS.match('linen', linen_paths).items():
    nnx_path = ('model',) + match.rule.path('nnx', match.layout, match.index)
    linen_path = ('params',) + linen_path
    var = _get(nnx_specs, nnx_path)
    rows.append([
        format_path(linen_path),
        format_path(nnx_path),
        str(tuple(_get(nnx_trainer.abstract_state, nnx_path).shape)),
        str(_get(linen_specs, linen_path).spec),
        str(var.get_value()),
    ])
  header = ['Linen path', 'NNX path', 'shape', 'Linen spec', 'NNX spec']
  return header, rows


def show_sharding(title: str, array: jax.Array) -> None:
  """Prints `title` and the device grid of a 2-D array (layer 0 if stacked)."""
  print(f'\n{title}: shape {tuple(array.shape)}, {array.sharding.spec}')
  if array.ndim == 3:
    array = array[0]  # keeps the sharding of the other two axes
  jax.debug.visualize_array_sharding(array)


def run_demo(
    desc: ModelDescription, steps: int = 10, optimizer: str = 'adam',
    plot: str | None = 'linen-nnx-demo.png',
) -> int:
  mesh = desc.make_mesh()
  print(describe_mesh(mesh))
  print(f'\nModel: {desc}\nOptimizer: {optimizer}\n')
  linen_trainer = linen_train.make_trainer(desc, mesh, make_tx(optimizer))
  nnx_trainer = nnx_train.make_trainer(desc, mesh, optimizer)
  print_table(*parameter_rows(desc, mesh, linen_trainer, nnx_trainer))

  with jax.set_mesh(mesh):
    xs, ys = make_batches(desc, mesh, steps, seed=1)
    linen_state, nnx_state = start_from_linen(linen_trainer, nnx_trainer)
    (linen_path, (linen_kernel, _)), *_ = read_collection(linen_state.params, 'params').items()
    show_sharding('Linen params/' + format_path(linen_path), linen_kernel)
    model, _ = nnx_trainer.merge(nnx_state)
    (nnx_path, nnx_kernel), *_ = nnx.to_flat_state(nnx.state(model))
    show_sharding('NNX model/' + format_path(nnx_path), nnx_kernel[...])
    rows, identical = [], True
    losses = {'linen': [], 'nnx': []}
    for step in range(steps):
      linen_state, linen_loss = linen_trainer.train_step(linen_state, xs[step], ys[step])
      nnx_state, nnx_loss = nnx_trainer.train_step(nnx_state, xs[step], ys[step])
      losses['linen'].append(float(linen_loss))
      losses['nnx'].append(float(nnx_loss))
      same = np.asarray(linen_loss).tobytes() == np.asarray(nnx_loss).tobytes()
      identical &= same
      rows.append([
          str(step + 1), f'{float(linen_loss):.9g}', f'{float(nnx_loss):.9g}',
          'yes' if same else 'NO',
      ])
  print(f'\nTraining {steps} steps on the same batches, NNX converted from Linen:')
  print_table(['step', 'Linen loss', 'NNX loss', 'bit-identical'], rows)
  if plot:
    title = f'{desc.num_layers} layers, depth {desc.depth}, {optimizer}'
    written = plot_losses(losses['linen'], losses['nnx'], plot, title)
    if written:
      print(f'\nLoss curves of both sides: {written}')
    else:
      print(f'\nNo loss plot: matplotlib is not installed. To get it: {INSTALL_HINT}')
  return 0 if identical else 1
