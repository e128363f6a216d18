"""Checks that run on the laptop before any Mac is rented (``audit``, ``preflight``).

They answer "do I need the rental at all?" from the project alone, so they must
start fast and never import torch themselves.
"""
