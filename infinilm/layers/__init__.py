"""The model layer's building blocks; each calls `infiniops_py` operators for its heavy work."""
