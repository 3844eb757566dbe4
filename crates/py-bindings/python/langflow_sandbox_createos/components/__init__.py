"""Bundles of the ``langflow-sandbox-createos`` extension (lfx loads them by file path)."""
