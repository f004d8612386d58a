"""The demo's loss plot: both loss curves overlaid, written as a PNG.

matplotlib is an optional extra (`pip install 'linen-nnx-kit[plot]'`); without
it `plot_losses` says how to get the plot and returns None, and the demo goes on.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

INSTALL_HINT = "pip install -e '.[plot]'  (the plot extra: matplotlib)"


def plot_losses(
    linen: Sequence[float], nnx: Sequence[float], path: str | os.PathLike, title: str = ''
) -> str | None:
  """Writes both loss curves to the PNG `path`; None when matplotlib is missing."""
  try:
    import matplotlib

    matplotlib.use('Agg')  # files only: no display needed
    from matplotlib import pyplot as plt
  except ImportError:
    return None
  steps = range(1, len(linen) + 1)
  fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
  try:
    ax.plot(steps, linen, label='Linen', linewidth=4, alpha=0.5)
    ax.plot(steps, nnx, label='NNX (converted from Linen)', linestyle='--', marker='.')
    ax.set_xlabel('step')
    ax.set_ylabel('loss')
    ax.set_title(title or 'Linen and NNX losses, same parameters and batches')
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.fspath(path), format='png')
  finally:
    plt.close(fig)
  return os.fspath(path)
