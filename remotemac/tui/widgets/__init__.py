"""Widgets of the run screen: timeline, log, connection badge, memory sparkline."""
