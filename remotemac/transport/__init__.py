"""Transports: how the engine reaches a host (``local`` or ``ssh``).

asyncssh still imports DSA at import time, and cryptography ≥ 47 warns about DSA on
every import: ten lines on a user's stderr before a one-line error, for an algorithm
remotemac never offers (host keys are pinned, the user's keys are theirs). Those
warnings, and only those from asyncssh's own modules, are silenced here, before any
module of this package imports asyncssh.
"""

from __future__ import annotations

import warnings

try:
    from cryptography.utils import CryptographyDeprecationWarning
except ImportError:  # an older cryptography: nothing to silence
    pass
else:
    warnings.filterwarnings(
        "ignore", category=CryptographyDeprecationWarning, module=r"asyncssh(\.|$)"
    )
