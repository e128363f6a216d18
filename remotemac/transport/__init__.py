"""Transports: how the engine reaches a host (``local`` or ``ssh``)."""
