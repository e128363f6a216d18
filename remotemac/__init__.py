"""remotemac: run a PyTorch workload on a rented Apple-Silicon Mac and decide on evidence."""

__version__ = "0.1.0"
