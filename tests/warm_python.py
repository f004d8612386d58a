"""Python processes for the tests, started from an interpreter that has imported JAX already.

A test that needs a process of its own (a docs page, a `linen-nnx` run, one
process of a multi-process job) pays Python, JAX, Flax, Optax and Orbax
being imported again: about 2 of the 3 seconds such a process takes before
it does anything. `command(args, env)` turns `[sys.executable, ...]` into
the command of a launcher: a bare interpreter (`-S`, no imports but the
standard library's) that hands its argument list, directory, environment
and standard streams (the descriptors themselves) to a server of this
module, which forks a child that runs them as `python ARGS` would and
reports its exit status, which the launcher exits with (a signal's, by
that signal). The child is a process of its own, with its own JAX backend
and devices: the server imports those libraries but never starts a
backend, and forks only while it runs one Python thread (NumPy's BLAS pool
aside, which makes itself again in a child).

The test's `subprocess` calls are unchanged, pipes, timeouts and kills
included: a launcher killed takes its child with it, and a launcher whose
server cannot take the request (not up yet, gone, another environment,
threads running) runs the arguments itself (`os.execv`), as the plain
command would. One server per environment (`env`), started on first use
and stopped when the test process exits; an environment is read at import
(`JAX_*`, `PYTHONPATH`), so a request in another one is refused, never
served by a server started in it (`UNREAD_AT_IMPORT` aside).
`WARM_PYTHON=0` runs every command as written (to compare).

Not for a test whose claim is what a new process imports or holds in
memory before it runs (the written test without the port extra, the
allocator's page faults): those start the plain command. A child that
stops itself (`SIGSTOP`, as the SIGKILL tests' drivers do) stops its
launcher too, so the test sees the process it started stop. Served, the tests that start such processes took 10% less
(docs pages, command-line runs, multi-process jobs: 65 s and 71 s against
72 s and 77 s, alternating, two processes).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

#: What the server imports before serving: third-party libraries only (a
#: child imports the kit itself, as a new process would).
PRELOAD = ('numpy', 'jax', 'jax.numpy', 'flax.linen', 'flax.nnx', 'optax', 'orbax.checkpoint')

#: The launcher: hands its arguments, directory, environment and streams
#: to the server; runs them itself when the server does not take them.
LAUNCHER = r'''
import json, os, signal, socket, sys
path, argv = sys.argv[1], sys.argv[2:]
def alone():
  os.execv(sys.executable, [sys.executable, *argv])
try:
  s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
  s.connect(path)
  request = json.dumps({'argv': argv, 'cwd': os.getcwd(), 'env': dict(os.environ)}).encode()
  socket.send_fds(s, [request], [0, 1, 2])
  reply = s.recv(64)
except OSError:
  alone()
if not reply.startswith(b'pid '):
  alone()
pid = int(reply[4:])
for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
  signal.signal(number, lambda n, _: os.kill(pid, n))
reply = s.recv(64)
while reply == b'stopped':  # the child stopped itself: so does the launcher, for its parent to see
  os.kill(os.getpid(), signal.SIGSTOP)
  os.kill(pid, signal.SIGCONT)  # continued: so is the child
  reply = s.recv(64)
if not reply.startswith(b'exit '):  # the server gone: its child must not outlive the launcher
  try:
    os.kill(pid, signal.SIGKILL)
  except ProcessLookupError:
    pass
  sys.exit(1)
code = int(reply[5:])
if code < 0:  # killed by a signal: so is the launcher
  try:
    signal.signal(-code, signal.SIG_DFL)
  except (OSError, ValueError):  # SIGKILL, SIGSTOP: always the default
    pass
  os.kill(os.getpid(), -code)
sys.exit(code)
'''

#: Variables a server may serve a request with another value of: nothing
#: reads them at import (pytest names the running test in the first).
UNREAD_AT_IMPORT = frozenset({'PYTEST_CURRENT_TEST'})

_servers: dict[tuple, tuple[subprocess.Popen, str]] = {}


def _key(env: dict) -> tuple:
  return tuple(sorted((k, v) for k, v in env.items() if k not in UNREAD_AT_IMPORT))


def command(args: list[str], env: dict | None = None) -> list[str]:
  """`args` (`[sys.executable, ...]`) as the launcher's command, for a
  process run in `env` (this process's environment if None)."""
  plain = len(args) > 1 and (args[1] in ('-m', '-c') or not args[1].startswith('-'))
  off = os.environ.get('WARM_PYTHON') == '0'  # every command as written, to compare
  if off or not plain or args[0] != sys.executable or not hasattr(socket, 'send_fds'):
    return list(args)  # interpreter options (-u, -X): started as written
  env = dict(os.environ if env is None else env)
  key = _key(env)
  if key not in _servers or _servers[key][0].poll() is not None:
    _servers[key] = _start(env)
  return [sys.executable, '-S', '-c', LAUNCHER, _servers[key][1], *args[1:]]


def _start(env: dict) -> tuple[subprocess.Popen, str]:
  path = os.path.join(tempfile.mkdtemp(prefix='warm-python-'), 'socket')
  server = subprocess.Popen(
      [sys.executable, os.path.abspath(__file__), path], env=env, cwd=os.path.dirname(path),
      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
  )
  atexit.register(_stop, server, path)
  return server, path


def _stop(server: subprocess.Popen, path: str) -> None:
  server.kill()
  server.wait()
  shutil.rmtree(os.path.dirname(path), ignore_errors=True)


# --- the server (this file run as a script) ---


def _threads() -> int:
  return len(os.listdir('/proc/self/task')) if os.path.isdir('/proc/self/task') else 1 << 30


def serve(path: str) -> None:
  """Imports `PRELOAD`, then forks a child for each launcher that connects
  to `path` in this process's environment."""
  import importlib
  import threading

  own_env = dict(os.environ)  # before the imports, some of which set variables
  importlib.import_module('numpy')
  # NumPy's BLAS keeps its own thread pool, which it makes again in a forked
  # child; any thread beyond those would be copied mid-work.
  blas_threads = _threads()
  for name in PRELOAD:
    importlib.import_module(name)
  single = lambda: threading.active_count() == 1 and _threads() <= blas_threads
  listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
  # Listening before it has its name: a launcher that finds the socket is
  # served, never refused by a socket bound but not yet listening.
  listener.bind(path + '.binding')
  listener.listen(64)
  os.rename(path + '.binding', path)
  children: dict[int, socket.socket] = {}  # child pid -> its launcher's connection
  parent = os.getppid()
  while os.getppid() == parent:  # the test process gone (killed): so is its server
    ready, _, _ = select.select([listener, *children.values()], [], [], 0.05)
    for connection in ready:
      if connection is listener:
        _accept(listener, own_env, children, single)
      else:  # a launcher gone (killed): its child goes too
        pid = next(p for p, c in children.items() if c is connection)
        if not connection.recv(64):
          _kill(pid)
    while children:
      pid, status = os.waitpid(-1, os.WNOHANG | os.WUNTRACED)
      if pid == 0:
        break
      if os.WIFSTOPPED(status):
        if pid in children:
          children[pid].send(b'stopped')
        continue
      connection = children.pop(pid, None)
      if connection is not None:
        try:
          connection.send(b'exit %d' % os.waitstatus_to_exitcode(status))
        except OSError:
          pass
        connection.close()


def _kill(pid: int) -> None:
  try:
    os.kill(pid, signal.SIGKILL)
  except ProcessLookupError:
    pass


def _accept(listener: socket.socket, own_env: dict, children: dict, single) -> None:
  connection, _ = listener.accept()
  try:
    message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
    request = json.loads(message)
  except (OSError, ValueError):
    connection.close()
    return
  if _key(request['env']) != _key(own_env) or len(fds) != 3 or not single():
    connection.send(b'refused')
    connection.close()
    for fd in fds:
      os.close(fd)
    return
  sys.stdout.flush()
  sys.stderr.flush()
  pid = os.fork()
  if pid == 0:
    listener.close()
    for other in children.values():
      other.close()
    connection.close()
    _run_child(request, fds)
  for fd in fds:
    os.close(fd)
  connection.send(b'pid %d' % pid)
  children[pid] = connection


def _run_child(request: dict, fds: list[int]) -> None:
  """In the forked child: becomes `python ARGV` in the launcher's
  directory, environment and streams, and exits as it would."""
  import atexit as child_atexit
  import runpy
  import traceback
  import types

  code = 0
  try:
    for fd, target in zip(fds, (0, 1, 2)):
      os.dup2(fd, target)
      os.close(fd)
    os.chdir(request['cwd'])
    for name in UNREAD_AT_IMPORT:  # the launcher's own values
      if name in request['env']:
        os.environ[name] = request['env'][name]
      else:
        os.environ.pop(name, None)
    argv = request['argv']
    here = os.getcwd()
    main = types.ModuleType('__main__')
    if argv[:1] == ['-m']:
      sys.argv = [argv[1], *argv[2:]]
      sys.path[0] = here
      runpy.run_module(argv[1], run_name='__main__', alter_sys=True)
    elif argv[:1] == ['-c']:
      sys.argv = ['-c', *argv[2:]]
      sys.path[0] = ''
      sys.modules['__main__'] = main
      exec(compile(argv[1], '<string>', 'exec'), main.__dict__)  # noqa: S102 - what python -c does
    else:
      sys.argv = list(argv)
      sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
      runpy.run_path(argv[0], run_name='__main__')
  except SystemExit as e:
    if e.code is None:
      code = 0
    elif isinstance(e.code, int):
      code = e.code
    else:
      print(e.code, file=sys.stderr)
      code = 1
  except BaseException:  # noqa: BLE001 - as the interpreter reports an uncaught exception
    traceback.print_exc()
    code = 1
  try:
    child_atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
  finally:
    os._exit(code)


if __name__ == '__main__':
  serve(sys.argv[1])
