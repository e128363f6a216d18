"""The dataset slice on the local side: which files travel, their manifest, their keys.

``slice`` picks the files and says why, ``manifest`` hashes them and names the
revision, ``keys`` keeps the per-run data key. Encryption itself lives in
``remotemac.agent.streamcrypt`` because the host runs the same code to decrypt.
"""

from remotemac.data.keys import destroy_data_key, load_data_key, new_data_key
from remotemac.data.manifest import (
    HashCache,
    Manifest,
    ManifestEntry,
    MemoryHashCache,
    build_manifest,
)
from remotemac.data.slice import SliceFile, SliceSelection, select_slice

__all__ = [
    "HashCache",
    "Manifest",
    "ManifestEntry",
    "MemoryHashCache",
    "SliceFile",
    "SliceSelection",
    "build_manifest",
    "destroy_data_key",
    "load_data_key",
    "new_data_key",
    "select_slice",
]
