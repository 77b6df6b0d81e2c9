"""The httpx adapter's implementation; ``autothrottle.httpx`` is its public face.

``_common`` holds what the async and sync halves share; ``_async`` is the
async half, written by hand; ``_sync`` is generated from it by
``scripts/unasync.py`` (a test checks it is current). The ``httpx2`` adapter
(``autothrottle._httpx2``) is generated from these modules by the same
script: one source for two clients and both modes.
"""
