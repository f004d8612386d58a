"""Random Linen programs for the property of `linen-nnx port`: Flax layers
composed by configuration fields, as the source of a module file.

A program is a sequence of steps, each reading fields of the module (a loop
over a tuple of widths, a width and a flag, a flag that adds a layer, an
optional width (by an `if`, or an `if` expression), a rate under the call's
`train` flag, a config dataclass, a string picking code), then a head. `configurations` draws values for every
field, so a port written at one configuration is checked at others.
"""

from __future__ import annotations

import dataclasses
import textwrap

from hypothesis import strategies as st

#: `(fields it reads, the lines of `__call__` it adds)` of each step; `{act}`
#: is the program's activation. The fields are declared in this order.
STEPS = {
    'loop': (('widths',), """
        for width in self.widths:
          x = {act}(nn.Dense(width)(x))
    """),
    'dense': (('features', 'use_bias'), """
        x = nn.Dense(self.features, use_bias=self.use_bias)(x)
    """),
    'norm': (('norm',), """
        if self.norm:
          x = nn.LayerNorm()(x)
    """),
    'dropout': (('rate',), """
        x = nn.Dropout(self.rate, deterministic=not train)(x)
    """),
    'optional': (('out_dim',), """
        if self.out_dim is not None:
          x = {act}(nn.Dense(self.out_dim)(x))
    """),
    'projection': (('proj',), """
        x = x if self.proj is None else nn.Dense(self.proj)(x)
    """),
    'config': (('config',), """
        x = nn.Dense(self.config.hidden)(x) * self.config.scale
    """),
    'residual': ((), """
        x = x + {act}(nn.Dense(x.shape[-1])(x))
    """),
    'switch': (('kind',), """
        if self.kind == 'tanh':
          x = nn.tanh(x)
        elif self.kind == 'scaled':
          x = x * 0.5
    """),
    'second_loop': (('depths',), """
        for depth in self.depths:
          x = nn.Dense(depth)(x)
    """),
}

#: Each field's declaration.
FIELDS = {
    'widths': 'widths: tuple[int, ...] = (4, 4)',
    'features': 'features: int = 4',
    'use_bias': 'use_bias: bool = True',
    'norm': 'norm: bool = False',
    'rate': 'rate: float = 0.5',
    'out_dim': 'out_dim: int | None = None',
    'proj': 'proj: int | None = None',
    'config': 'config: Config = Config()',
    'depths': 'depths: tuple[int, ...] = (3,)',
    'kind': "kind: str = 'plain'",
    'num_classes': 'num_classes: int = 3',
}

ACTIVATIONS = ('nn.relu', 'nn.tanh', 'nn.gelu', 'nn.silu')

_CONFIG = '''

@dataclasses.dataclass(frozen=True)
class Config:
  """Sizes kept in a config object."""

  hidden: int = 5
  scale: float = 1.0
'''


@dataclasses.dataclass(frozen=True)
class Program:
  """One random Linen module: its file's source and its fields."""

  steps: tuple[str, ...]
  activation: str

  @property
  def fields(self) -> tuple[str, ...]:
    names = [f for step in self.steps for f in STEPS[step][0]]
    return (*dict.fromkeys(names), 'num_classes')

  @property
  def trains(self) -> bool:
    """Whether its call takes `train` (a dropout step)."""
    return 'dropout' in self.steps

  def source(self) -> str:
    body = ''.join(
        textwrap.indent(textwrap.dedent(STEPS[step][1]).strip('\n'), '    ') + '\n'
        for step in self.steps
    ).replace('{act}', self.activation)
    fields = ''.join(f'  {FIELDS[f]}\n' for f in self.fields)
    call = 'def __call__(self, x, train: bool = False):' if self.trains else 'def __call__(self, x):'
    return (
        '"""A random Linen program (tests/converters/port/random_programs.py)."""\n\n'
        'import dataclasses\n\nfrom flax import linen as nn\n'
        + (_CONFIG if 'config' in self.fields else '')
        + f'\n\nclass Model(nn.Module):\n  """Steps: {", ".join(self.steps)}."""\n\n{fields}\n'
        f'  @nn.compact\n  {call}\n{body}    return nn.Dense(self.num_classes)(x)\n'
    )


def programs() -> st.SearchStrategy[Program]:
  steps = st.lists(st.sampled_from(sorted(STEPS)), min_size=1, max_size=4, unique=True)
  return st.builds(Program, steps.map(tuple), st.sampled_from(ACTIVATIONS))


_SIZES = st.integers(2, 7)


def values(field: str) -> st.SearchStrategy:
  """Values of one field (a config object's as a dict of its fields)."""
  return {
      'widths': st.lists(_SIZES, min_size=0, max_size=3).map(tuple),
      'depths': st.lists(_SIZES, min_size=1, max_size=3).map(tuple),
      'features': _SIZES,
      'use_bias': st.booleans(),
      'norm': st.booleans(),
      'rate': st.sampled_from((0.1, 0.25, 0.5, 0.75)),
      'out_dim': st.none() | _SIZES,
      'proj': st.none() | _SIZES,
      'config': st.fixed_dictionaries({'hidden': _SIZES, 'scale': st.sampled_from((0.5, 1.0, 2.0, 3.0))}),
      'num_classes': _SIZES,
      'kind': st.sampled_from(('plain', 'tanh', 'scaled')),
  }[field]


def configurations(program: Program) -> st.SearchStrategy[dict]:
  """A value for every field, and the input's width (`in_features`)."""
  return st.fixed_dictionaries({f: values(f) for f in program.fields} | {'in_features': _SIZES})
