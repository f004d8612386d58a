"""`converters.port.switches`: the strings a configuration's fields switch
the source on, compared directly or in a function they are handed to."""

from __future__ import annotations

from converters.port import switches

_SOURCE = '''
def get_posemb(self, typ, width, name):
  if typ == 'learn':
    return self.param(name, init, (1, width))
  elif typ in ('sincos2d', 'sincos1d'):
    return fixed(width)
  return {'zeros': 0, 'ones': 1}[typ]


class Model:
  def __call__(self, x):
    if self.pool_type == 'map':
      x = x.mean()
    match self.norm:
      case 'layer' | 'rms':
        pass
    x = x + get_posemb(self, self.posemb, 4, name='pos')
    return x + get_posemb(self, name='other', typ=self.other_posemb, width=4)
'''


def test_fields_compared_matched_or_handed_to_a_function_comparing_them(tmp_path):
  path = tmp_path / 'model.py'
  path.write_text(_SOURCE)
  strings = switches.named_strings([str(path)])
  assert strings['pool_type'] == {'map'} and strings['norm'] == {'layer', 'rms'}
  every_posemb = {'learn', 'sincos2d', 'sincos1d', 'zeros', 'ones'}
  assert strings['posemb'] == every_posemb  # handed by position
  assert strings['other_posemb'] == every_posemb  # by keyword
  assert 'width' not in strings and 'typ' not in strings  # a parameter is no field


def test_the_fields_looped_over_directly_or_through_a_call(tmp_path):
  path = tmp_path / 'model.py'
  path.write_text('''
class Model:
  def __call__(self, x):
    for i, size in enumerate(self.stage_sizes):
      x = x * size
    x = sum(w for w in self.config.widths)
    for i in range(len(self.features)):
      x = x + i
    return conv(x, kernel_size=self.patch_size)
''')
  assert switches.looped_over([str(path)]) == {'stage_sizes', 'widths', 'config', 'features'}
