"""Code shipped to the host: standard library only, runs on Python 3.9.

The orchestrator uploads this directory once per content hash to
``<remote_root>/agent/<hash>/`` and asks the resident agent there (resident.py) for
operations with JSON requests, so that no long shell pipelines (BSD vs GNU tools) are
ever built. On the host this directory is one package, ``rmagent``: its modules import
each other relatively, and every process of the agent starts by the one boot of
shared.py. The laptop imports from it only what both sides share.
It runs under the host's own ``python3`` (``agent.python``), never the workload's
venv. The one third-party module it needs, ``cryptography`` for decrypting the
slice, it installs itself into ``<remote_root>/runtime/<hash>/`` (agentruntime.py)
and imports from there only.
"""
