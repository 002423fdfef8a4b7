"""Byte I/O below every format: where bytes come from (:mod:`~aprfast.io.sources`), how they
are written atomically (:mod:`~aprfast.io.atomic`), platform calls
(:mod:`~aprfast.io.platform`), how open handles pickle (:mod:`~aprfast.io.pickling`) and
how long calls show their progress on stderr (:mod:`~aprfast.io.progress`).

Nothing here knows a file format; remote sources (:mod:`aprfast.remote`) are built on it.
"""
