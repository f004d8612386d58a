"""Agreement between the processes of a multi-controller JAX run.

Under `jax.distributed`, every process runs the same conversion on its own
shards, and the collectives inside assume they all do the same thing: if one
process was given another layout or holds another tree, the run would hang in
a collective. `agree` prevents that: before any array is touched, every process
publishes a JSON description of what it is about to do in the coordination
service's key-value store, reads the others' with a timeout, and raises
`ProcessMismatchError` naming the process and every field that differs (or the
process that never arrived). `exchange` is the bare publish-and-gather, used to
share one process's value (a directory name) or to combine per-process results.

With one process both are free: nothing is published.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Mapping
from typing import Any

import jax

from converters import compat
from converters.errors import ConversionError, format_offenders

__all__ = ['DEFAULT_TIMEOUT_S', 'ProcessMismatchError']

#: Seconds a process waits for the others to agree (or to report a failure)
#: before every process raises `ProcessMismatchError`.
DEFAULT_TIMEOUT_S = 120.0
_POLL_S = 1.0  # how often a waiting process looks for a reported failure
_calls = itertools.count()


class ProcessMismatchError(ConversionError):
  """Processes of one run were given different work, or one never arrived."""


def _client():
  client = compat.distributed_client()
  if client is None:
    raise ProcessMismatchError(
        f'{jax.process_count()} processes but no jax.distributed client; call '
        'jax.distributed.initialize() before converting'
    )
  return client


def exchange(label: str, value: Any, timeout_s: float | None = None) -> list[Any]:
  """Every process's JSON-able `value`, in process order.

  Every process must call `exchange` the same number of times in the same
  order; each call is numbered, so a process on another path is caught by
  `label`. Raises `ProcessMismatchError` when a process does not arrive within
  `timeout_s` (default `DEFAULT_TIMEOUT_S`), reported a failure, or arrives
  with another label.
  """
  if jax.process_count() == 1:
    return [value]
  timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
  client = _client()
  call = next(_calls)
  me = jax.process_index()
  key = lambda p: f'linen-nnx/{call}/{p}'
  client.key_value_set(key(me), json.dumps({'label': label, 'value': value}, sort_keys=True))
  deadline = time.monotonic() + timeout_s
  try:
    return [
        _gather_one(client, label, key(p), p, me=me, deadline=deadline, timeout_s=timeout_s)
        for p in range(jax.process_count())
    ]
  except ProcessMismatchError:
    # Withdraw this process's value: a late process must learn that this one
    # gave up (its failure report), not find the value and go on alone.
    client.key_value_delete(key(me))
    raise


def _gather_one(client, label: str, key: str, p: int, *, me: int, deadline: float, timeout_s: float):
  """Process `p`'s value of one exchange, waiting until `deadline`."""
  # A value already published wins over a failure reported after it: the
  # failing process may be one that saw this very exchange disagree.
  text = _try_get(client, key)
  while text is None:
    failed = _try_get(client, _failed_key(p))
    if failed is not None:
      client.key_value_set(_seen_key(me, p), 'seen')
      raise ProcessMismatchError(f'{label}: process {p} failed: {failed}')
    remaining = deadline - time.monotonic()
    if remaining <= 0:
      raise ProcessMismatchError(
          f'{label}: process {p} did not arrive within {timeout_s:.0f} s (this is '
          f'process {me}); it is stuck or doing other work'
      )
    try:
      text = client.blocking_key_value_get(key, int(min(remaining, _POLL_S) * 1000))
    except Exception:  # a timeout: look for a reported failure, then wait on
      pass
  got = json.loads(text)
  if got['label'] != label:
    raise ProcessMismatchError(
        f'process {p} is at {got["label"]!r} while process {me} is at '
        f'{label!r}; every process must run the same conversion steps'
    )
  return got['value']


def _failed_key(process: int) -> str:
  return f'linen-nnx/failed/{process}'


def _seen_key(process: int, failed: int) -> str:
  return f'linen-nnx/seen/{failed}/{process}'


def _try_get(client, key: str) -> str | None:
  try:
    return client.key_value_try_get(key)
  except Exception:  # NOT_FOUND
    return None


def report_failure(message: str, wait_s: float = 30.0) -> None:
  """Tells the other processes this one failed, so they stop waiting for it.

  Call it before a failing process exits: the others raise
  `ProcessMismatchError` naming this process and `message` at their next
  `exchange` or `agree`, instead of waiting for their timeout (or being
  aborted by JAX when this process disconnects). Waits up to `wait_s` until
  every other process has seen the report or failed too.
  """
  if jax.process_count() == 1:
    return
  client = _client()
  me = jax.process_index()
  client.key_value_set(_failed_key(me), ' '.join(message.split())[:2000])
  deadline = time.monotonic() + wait_s
  waiting = set(range(jax.process_count())) - {me}
  while waiting and time.monotonic() < deadline:
    # A process is done with us once it saw the report or failed itself.
    waiting = {
        p for p in waiting
        if _try_get(client, _seen_key(p, me)) is None and _try_get(client, _failed_key(p)) is None
    }
    time.sleep(0.1)


def _differences(a: Any, b: Any, path: str = '') -> list[str]:
  if isinstance(a, Mapping) and isinstance(b, Mapping):
    out = []
    for k in sorted(set(a) | set(b), key=str):
      where = f'{path}/{k}' if path else str(k)
      if k not in a or k not in b:
        out.append(f'{where} (only in process {"B" if k not in a else "A"})')
      else:
        out += _differences(a[k], b[k], where)
    return out
  return [] if a == b else [f'{path or "value"}: {a!r} vs {b!r}']


def agree(label: str, value: Mapping[str, Any], timeout_s: float | None = None) -> None:
  """Raises `ProcessMismatchError` unless every process passes an equal `value`.

  The message names each process that differs from process 0 and every
  differing field, with both values.
  """
  values = exchange(label, value, timeout_s)
  problems = []
  for p, other in enumerate(values[1:], start=1):
    diffs = [d.replace('process A', 'process 0').replace('process B', f'process {p}')
             for d in _differences(values[0], other)]
    if diffs:
      problems.append(f'process {p} differs from process 0 in {format_offenders(diffs, 20)}')
  if problems:
    raise ProcessMismatchError(
        f'{label}: ' + '; '.join(problems) + '; give every process the same '
        'arguments and the same trees',
        [p.split(' differs')[0] for p in problems],
    )
