"""The `linen-nnx` command line: what a person runs and sees.

`main` runs one command, a module each (`demo_command`, `convert_command`,
`compare_command`, `map_command`, `side_by_side_command`, `port_command`)
with the options they share (`options`), what each needs prepared and the
multi-process job it may join (`runtime`), and failures in one line and an
exit code (`failures`); `kit_models` gives the checkpoint tool
the kit's MLP as a model pair (and `models_for` the pair the options
describe), `demo` and `compare_training` run the
kit's MLP in both frameworks, `progress` (rich's bar on a terminal, lines in
logs) and `tables` (rich's tables on a terminal, plain text elsewhere) draw on
the screen, `plot` draws the demo's loss curves, `side_by_side` renders the
two implementations paired concept by concept, and `devices` sets up simulated
CPU devices before JAX loads.

May import: everything below it (`converters`, its checkpoint tool and
testing helpers, `kit_mlp`, `linen_impl`, `nnx_impl`); nothing imports it.
Loading this package imports no JAX, so `devices` can act first.
"""
