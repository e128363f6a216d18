"""The engine: a run is a sequence of phases over a Transport, emitting events."""
