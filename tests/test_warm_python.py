"""Tests of `tests/warm_python.py`: a process forked from a warm interpreter
behaves as `python ARGS` would, or is that plain command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests import warm_python

if not hasattr(__import__('socket'), 'send_fds'):
  pytest.skip('no descriptor passing here: every command runs as written', allow_module_level=True)

#: Prints what a process is: its parent, argv, directory, sys.path[0], and
#: whether JAX was imported and its backend started before it ran.
_REPORT = '''
import json, os, sys
started = 'jax' in sys.modules and bool(sys.modules['jax']._src.xla_bridge._backends)
print(json.dumps({'parent': os.getppid(), 'argv': sys.argv, 'cwd': os.getcwd(), 'path0': sys.path[0],
                  'jax': 'jax' in sys.modules, 'backend': started, 'main': __name__}))
'''


def _served(args, env, **kwargs) -> subprocess.CompletedProcess:
  """`args` run through a server that is up (the first request, while it
  imports, is run as written): its socket is named once it listens."""
  command = warm_python.command(args, env)
  server = warm_python._servers[warm_python._key(env)]
  deadline = time.monotonic() + 120
  while not os.path.exists(server[1]) and time.monotonic() < deadline:
    time.sleep(0.05)
  return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False, **kwargs)


@pytest.fixture
def env():
  return {**os.environ, 'WARM_PYTHON_TEST': '1'}


def test_a_served_process_is_a_child_of_the_server_with_jax_imported_and_no_backend(env, tmp_path):
  result = _served([sys.executable, '-c', _REPORT, 'a', 'b'], env, cwd=tmp_path)
  report = json.loads(result.stdout)
  server = warm_python._servers[warm_python._key(env)][0]
  assert report == {'parent': server.pid, 'argv': ['-c', 'a', 'b'], 'cwd': str(tmp_path), 'path0': '',
                    'jax': True, 'backend': False, 'main': '__main__'}


def test_modules_and_scripts_see_argv_and_path_as_python_gives_them(env, tmp_path):
  (tmp_path / 'script.py').write_text(_REPORT)
  report = json.loads(_served([sys.executable, str(tmp_path / 'script.py'), 'x'], env, cwd='/').stdout)
  assert (report['argv'], report['path0'], report['cwd']) == ([str(tmp_path / 'script.py'), 'x'], str(tmp_path), '/')
  (tmp_path / 'reporting.py').write_text(_REPORT)
  report = json.loads(_served([sys.executable, '-m', 'reporting', 'y'], env, cwd=tmp_path).stdout)
  assert (report['argv'], report['path0']) == ([str(tmp_path / 'reporting.py'), 'y'], str(tmp_path))


def test_exit_codes_exceptions_and_signals_are_the_processs_own(env):
  assert _served([sys.executable, '-c', 'import sys; sys.exit(3)'], env).returncode == 3
  assert _served([sys.executable, '-c', 'import sys; sys.exit("told why")'], env).returncode == 1
  failed = _served([sys.executable, '-c', 'raise ValueError("boom")'], env)
  assert failed.returncode == 1 and 'ValueError: boom' in failed.stderr
  killed = _served([sys.executable, '-c', 'import os, signal; os.kill(os.getpid(), signal.SIGKILL)'], env)
  assert killed.returncode == -signal.SIGKILL
  # atexit handlers run at a normal exit, and streams are flushed.
  done = _served([sys.executable, '-c', 'import atexit, sys; atexit.register(print, "bye"); print("hi", end="")'], env)
  assert (done.returncode, done.stdout) == (0, 'hibye\n')


def test_a_launcher_killed_takes_its_child_with_it(env, tmp_path):
  _served([sys.executable, '-c', 'pass'], env)  # the server is up
  marker = tmp_path / 'pid'
  code = f'import os, time; open({str(marker)!r}, "w").write(str(os.getpid())); time.sleep(60)'
  launcher = subprocess.Popen(warm_python.command([sys.executable, '-c', code], env), env=env)
  while not marker.exists() or not marker.read_text():
    time.sleep(0.05)
  child = int(marker.read_text())
  assert child != launcher.pid
  launcher.kill()
  assert launcher.wait(timeout=30) == -signal.SIGKILL
  deadline = time.monotonic() + 30
  while _alive(child) and time.monotonic() < deadline:
    time.sleep(0.05)
  assert not _alive(child)


def _alive(pid: int) -> bool:
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().split(') ')[1][0] != 'Z'
  except FileNotFoundError:
    return False


def test_another_environment_or_interpreter_options_run_the_command_as_written(env):
  _served([sys.executable, '-c', 'pass'], env)
  server = warm_python._servers[warm_python._key(env)]
  other = {**env, 'JAX_ENABLE_X64': '1'}  # read when JAX is imported: never served by this server
  launcher = warm_python.command([sys.executable, '-c', _REPORT], env)
  result = subprocess.run(launcher, env=other, capture_output=True, text=True, timeout=120, check=False)
  assert json.loads(result.stdout)['parent'] == os.getpid()  # the launcher became the command
  assert warm_python._servers[warm_python._key(env)] is server
  assert warm_python.command([sys.executable, '-u', '-c', 'pass'], env) == [sys.executable, '-u', '-c', 'pass']
  assert warm_python.command(['bash', '-c', 'true'], env) == ['bash', '-c', 'true']


def test_a_child_that_stops_itself_stops_its_launcher_and_dies_with_it(env):
  _served([sys.executable, '-c', 'pass'], env)
  code = 'import os, signal; os.kill(os.getpid(), signal.SIGSTOP); print("continued")'
  launcher = subprocess.Popen(warm_python.command([sys.executable, '-c', code], env), env=env,
                              stdout=subprocess.PIPE, text=True)
  _, status = os.waitpid(launcher.pid, os.WUNTRACED)  # as the SIGKILL tests wait
  assert os.WIFSTOPPED(status)
  os.kill(launcher.pid, signal.SIGCONT)  # continued: so is the child
  assert launcher.communicate(timeout=60)[0] == 'continued\n' and launcher.returncode == 0
