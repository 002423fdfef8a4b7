"""Pure-Python twins of aprfast's compiled modules (NumPy allowed).

One module per compiled module, same name, same public functions, classes and
signatures, same results bit for bit.  They are the readable reference of every
kernel: where the C is fast, this is plain.  :mod:`aprfast._backend` decides which set
runs (``APRFAST_BACKEND=python`` forces these).
"""
