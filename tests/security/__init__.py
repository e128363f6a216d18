"""Issue 15: the security suite (one test per item, each failing before its fix)."""
