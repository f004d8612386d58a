"""Planted bugs: one-line defects that the suite must catch (not collected by pytest).

Each entry is a one-line change to the code and the tests that must fail
because of it. Run from the repository root:

    .venv/bin/python -m tests.planted_bugs            # every bug against these tests
    .venv/bin/python -m tests.planted_bugs --tests-from REV   # against REV's tests
    .venv/bin/python -m tests.planted_bugs 3 9        # some bugs only

Each bug is applied to a fresh copy of the working tree (the tree itself is
never touched), after its tests have passed there without it. With the
current tests every bug must make its tests fail (not merely stop pytest);
with `--tests-from` an older commit's `tests/` runs instead, its own test
names (`old`), to show which bugs the older suite let through.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class PlantedBug:
  what: str
  file: str
  line: str  # must occur exactly once in `file`
  bug: str
  new: tuple[str, ...]  # pytest arguments selecting the tests that catch it
  old: tuple[str, ...] | None = None  # the same in the older suite, if they differ


BUGS = {
    1: PlantedBug(
        'adam keeps one moment, not two', 'kit_mlp/optimizers.py',
        '    return optax.adam(learning_rate)',
        '    return optax.sgd(learning_rate, momentum=0.9)',
        ('tests/linen_impl/test_train.py::test_optimizer_state_is_sharded_as_annotated[adam]',),
    ),
    2: PlantedBug(
        'Linen creates whole arrays, then shards them', 'linen_impl/train.py',
        '    return jax.jit(init, out_shardings=self.sharding)',
        '    return lambda key: jax.device_put(jax.jit(init)(key), self.sharding)',
        ('tests/linen_impl/test_train.py::test_creation_never_materialises_a_whole_array_on_one_device',),
    ),
    3: PlantedBug(
        'unstacking scales each layer by 1 + 2**-22 (within the tolerance, not exact)',
        'converters/relayout_ops.py',
        '    return [x[self.index] for x in arrays]',
        '    return [x[self.index] * (1 + 2**-22) for x in arrays]',
        ('tests/converters/test_equivalence.py::test_scanned_and_looped_models_with_the_same_params_agree',),
    ),
    4: PlantedBug(
        'activations resolved "earlier dimension wins"', 'kit_mlp/description.py',
        '    return tuple(nn.logical_to_mesh_axes(names, self.rules))',
        '    return (lambda a: tuple(x if x not in a[:i] else None for i, x in enumerate(a)))([self.mesh_axis(n) for n in names])',
        ('tests/nnx_impl/test_train.py', '-k', 'rule_listed_first'),
        ('tests/nnx_impl/test_train.py', '-k', 'activations'),
    ),
    5: PlantedBug(
        'a target of another dtype is accepted', 'converters/checks.py',
        '  if value.dtype != t_value.dtype:',
        '  if False:',
        ('tests/converters/test_equivalence.py', '-k', 'corrupted'),
    ),
    6: PlantedBug(
        'bits_equal compares only the common prefix', 'converters/comparison.py',
        '  if len(xs) != len(ys):',
        '  if False:',
        ('tests/converters/test_comparison.py', '-k', 'bits_equal'),
    ),
    7: PlantedBug(
        'NNX -> Linen adds one to the step', 'converters/api.py',
        "  step = scalar_like(step, getattr(target.step, 'dtype', np.dtype('int32')), mesh_hint, 'step')",
        "  step = scalar_like(step + 1, getattr(target.step, 'dtype', np.dtype('int32')), mesh_hint, 'step')",
        ('tests/converters/test_api.py', '-k', 'nnx_k_steps'),
    ),
    8: PlantedBug(
        'unstacking turns -0.0 into 0.0', 'converters/relayout_ops.py',
        '    return [x[self.index] for x in arrays]',
        '    return [xp.where(x[self.index] == 0, 0.0, x[self.index]) for x in arrays]',
        ('tests/converters/test_api.py', '-k', 'round_trips_are_the_identity'),
    ),
    9: PlantedBug(
        "Linen's adam mu becomes NNX's nu and nu mu", 'converters/optimizer_state.py',
        "      return ('opt_state',) + linen_prefix",
        "      return ('opt_state',) + tuple({'mu': 'nu', 'nu': 'mu'}.get(k, k) for k in linen_prefix)",
        ('tests/converters/checkpoint/test_convert.py', '-k', 'ordinary_code'),
    ),
    10: PlantedBug(
        'the verifying stage is skipped', 'converters/checkpoint/convert.py',
        '      leaves = check(partial)',
        '      leaves = 0',
        ('tests/converters/checkpoint/test_convert.py', '-k', 'fails_verification'),
    ),
    11: PlantedBug(
        "the JSON error keeps only the text before the first ':'", 'linen_nnx_cli/failures.py',
        "    print(json.dumps({'ok': False, 'exit_code': code, 'error': line}))",
        "    print(json.dumps({'ok': False, 'exit_code': code, 'error': line.split(':')[0]}))",
        ('tests/linen_nnx_cli/test_main_checkpoints.py::test_bad_input_exits_2_with_one_line_reason',),
    ),
    # 12: the test asserting the size of a literal dict is gone: nothing to plant.
    13: PlantedBug(
        'reading an NNX Variable replaces its value', 'converters/metadata.py',
        '  metadata = dict(variable.get_metadata())',
        '  metadata = dict(variable.get_metadata()); isinstance(variable.get_value(), jax.Array) and variable.set_value(variable.get_value() + 0)',
        ('tests/converters/test_errors.py', '-k', 'bad_nnx_input'),
    ),
    14: PlantedBug(
        "out_sharding is read and also kept as extra metadata", 'converters/metadata.py',
        "  names = metadata.pop('out_sharding', None)",
        "  names = metadata.get('out_sharding')",
        ('tests/converters/test_metadata.py', '-k', 'legacy'),
    ),
    15: PlantedBug(
        'a valid one-layer description is refused', 'kit_mlp/description.py',
        '    if self.num_layers < 1:',
        '    if self.num_layers < 2:',
        ('tests/kit_mlp/test_description.py', '-k', 'rejected_exactly'),
        ('tests/kit_mlp/test_description.py', '-k', 'either_rejected'),
    ),
    16: PlantedBug(
        'an unmapped parameter raises a bare KeyError', 'converters/paths.py',
        "      raise PathMappingError('; '.join(problems), unmapped + ambiguous, fix='; '.join(fixes))",
        "      raise KeyError('; '.join(problems))",
        ('tests/converters/test_testing.py::test_unmapped_parameters_fail_loudly',),
    ),
    17: PlantedBug(
        "Linen's adam mu becomes NNX's nu (the restore of docs/guides/convert_a_checkpoint.md)", 'converters/optimizer_state.py',
        "      return ('opt_state',) + linen_prefix",
        "      return ('opt_state',) + tuple({'mu': 'nu', 'nu': 'mu'}.get(k, k) for k in linen_prefix)",
        ('tests/test_docs.py::test_page_runs[docs/guides/convert_a_checkpoint.md]',),
    ),
    18: PlantedBug(
        'the witness never disagrees: a pairing the structure gives wrongly is returned',
        'converters/inference/witness.py',
        '      if not equal and not relative <= TOLERANCE.get(width, 1e-4):',
        '      if False:',
        # The structure alone pairs this symmetric case: only the witness refuses.
        ('tests/converters/inference/test_wrong_pairs.py', '-k', 'symmetric_example_input'),
    ),
    19: PlantedBug(
        'the operands of sums and products keep their positions', 'converters/inference/dataflow.py',
        "    if primitive in COMMUTATIVE or (self.relaxed and primitive in (primitives.concatenate_p, compat.STACK_P)):",
        "    if self.relaxed and primitive in (primitives.concatenate_p, compat.STACK_P):",
        # (test_infer's GLU test passes with it: where the graphs cannot pair
        # the kernels, the witness does.)
        ('tests/converters/inference/test_dataflow.py', '-k', 'operands_of_sums_commute'),
    ),
}


def _copy(destination: pathlib.Path, tests_from: str | None) -> None:
  files = subprocess.run(
      ['git', 'ls-files', '-co', '--exclude-standard'], cwd=ROOT, check=True,
      capture_output=True, text=True,
  ).stdout.split()
  for name in files:
    if (ROOT / name).is_file():
      (destination / name).parent.mkdir(parents=True, exist_ok=True)
      shutil.copy2(ROOT / name, destination / name)
  if tests_from:
    shutil.rmtree(destination / 'tests')
    archive = subprocess.run(['git', 'archive', tests_from, 'tests'], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(['tar', '-x', '-C', str(destination)], input=archive.stdout, check=True)


def _pytest(copy: pathlib.Path, args) -> tuple[int, str]:
  result = subprocess.run(
      [sys.executable, '-m', 'pytest', '-x', '-q', '-p', 'no:cacheprovider', *args],
      cwd=copy, capture_output=True, text=True, env={**os.environ, 'PYTHONPATH': str(copy)},
  )
  return result.returncode, (result.stdout.strip().splitlines() or [''])[-1]


def run(number: int, bug: PlantedBug, tests_from: str | None) -> bool:
  """Whether the selected tests pass as they are and fail with the bug planted.

  Only failing tests count as catching it: no tests collected, a collection
  error or a usage error (pytest's exit codes 2-5) stop the run instead.
  """
  with tempfile.TemporaryDirectory(prefix='planted-') as tmp:
    copy = pathlib.Path(tmp)
    _copy(copy, tests_from)
    path = copy / bug.file
    text = path.read_text()
    if text.count(bug.line) != 1:
      raise SystemExit(f'bug {number}: {bug.line!r} is not exactly once in {bug.file}')
    args = bug.old if tests_from and bug.old is not None else bug.new
    code, summary = _pytest(copy, args)
    if code != 0:
      raise SystemExit(f'bug {number}: the selected tests do not pass without it (exit {code}: {summary})')
    path.write_text(text.replace(bug.line, bug.bug))
    code, summary = _pytest(copy, args)
    if code not in (0, 1):
      raise SystemExit(f'bug {number}: pytest exit {code} with it planted ({summary}); fix the selection')
    print(f'{number:2d}. {bug.what}: {"caught" if code == 1 else "MISSED"} ({summary})', flush=True)
    return code == 1


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('numbers', nargs='*', type=int, help='bugs to plant (default: all)')
  parser.add_argument('--tests-from', help="run this commit's tests instead of the current ones")
  args = parser.parse_args()
  numbers = args.numbers or sorted(BUGS)
  caught = [run(n, BUGS[n], args.tests_from) for n in numbers]
  if args.tests_from:
    return 0  # a report: the older suite is expected to miss some
  return 0 if all(caught) else 1


if __name__ == '__main__':
  sys.exit(main())
