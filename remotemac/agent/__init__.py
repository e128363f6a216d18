"""Code shipped to the host: standard library only, runs on Python 3.9.

The orchestrator uploads this directory once per content hash to
``<remote_root>/agent/<hash>/`` and calls ``hostagent.py OP`` with a JSON request
on stdin, so that no long shell pipelines (BSD vs GNU tools) are ever built.
"""
