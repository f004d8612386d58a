"""Code of other projects the tests run unchanged (each folder says where it comes from)."""
