"""The Textual front end (``remotemac tui``): same engine and events as the CLI."""
