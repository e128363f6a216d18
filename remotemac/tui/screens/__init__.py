"""The TUI's screens: runs, one run, hosts, and the small dialogs they open."""
