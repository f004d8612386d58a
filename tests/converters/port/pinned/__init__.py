"""Ports `linen-nnx port` writes for models of `linen_models.py`, pinned as
text: `<name>_nnx.py` and `<name>_nnx_paths.py` are the files a nightly run
proved (`test_generate.test_the_pinned_ports_are_proven`), and CI checks that
the port writes them again (`test_generate._pinned`). `UPDATE_GOLDEN=1`
rewrites them; review their diff before committing it."""
