"""Numbers, not bytes: quantization (:mod:`~aprfast.numerics.quantization`), precision
changes (:mod:`~aprfast.numerics.precision`), tensor statistics
(:mod:`~aprfast.numerics.stats`), drift between two tensors
(:mod:`~aprfast.numerics.drift`) and the expected ranges of seed 001 §10.9
(:mod:`~aprfast.numerics.expectations`)."""
