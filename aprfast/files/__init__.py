"""The v2 file objects: :class:`~aprfast.files.reader.AprFile` (lazy reads), the plan
emitter and streaming :class:`~aprfast.files.writer.Writer`, sharded models
(:mod:`~aprfast.files.shards`), :func:`~aprfast.files.safe_open.safe_open`, tensor-parallel
loading (:mod:`aprfast.distributed`, one layer up: it opens files through the API) and the
framework conversions they share
(:mod:`~aprfast.files.frameworks`)."""
