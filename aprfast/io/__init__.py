"""Byte I/O below every format: where bytes come from (:mod:`~aprfast.io.sources`), how they
are written atomically (:mod:`~aprfast.io.atomic`), platform calls
(:mod:`~aprfast.io.platform`) and how open handles pickle (:mod:`~aprfast.io.pickling`).

Nothing here knows a file format; remote sources (:mod:`aprfast.remote`) are built on it.
"""
