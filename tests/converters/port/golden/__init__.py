"""Golden cases of `linen-nnx port`: each `<case>.py` is Linen code as users
write it, with a `model()` factory; `<case>_nnx.py` and `<case>_nnx_paths.py`
are what the port writes for it, reviewed. `test_golden.py` writes each case
again and compares the text, in well under a second a case; the nightly
test there proves each written port (`converters.port.port`)."""
