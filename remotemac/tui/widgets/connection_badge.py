"""The connection badge: connected / reconnecting (attempt n, next try in s) / lost."""

from __future__ import annotations

from textual.widgets import Static

from remotemac.tui.model import LinkState

_LOOK = {
    "local": ("●", "local (no link)"),
    "unknown": ("○", "not connected"),
    "connected": ("●", "connected"),
    "disconnected": ("◌", "link down"),
    "reconnecting": ("◌", "reconnecting"),
    "lost": ("✗", "lost"),
}


class ConnectionBadge(Static):
    """Shows the last ConnectionState; the CSS class is the state (for its colour)."""

    def __init__(self, **kwargs) -> None:
        super().__init__("", **kwargs)
        self.state = "unknown"
        self.shown: list[str] = []  # every state this badge has displayed, in order

    def show(self, link: LinkState) -> None:
        mark, words = _LOOK.get(link.state, ("?", link.state))
        text = f"{mark} {words}"
        if link.state == "reconnecting":
            text += f" · attempt {link.attempt}"
            if link.next_in_s is not None:
                text += f" · next try in {link.next_in_s:.1f}s"
            if link.deadline_left_s is not None:
                text += f" · gives up in {link.deadline_left_s:.0f}s"
        if link.host and link.state != "local":
            text += f"  [dim]{link.host}[/]"
        if link.detail and link.state in ("disconnected", "lost"):
            text += f"\n[dim]{link.detail[:60]}[/]"
        if link.state != self.state or not self.shown:
            self.remove_class(f"link-{self.state}")
            self.add_class(f"link-{link.state}")
            self.state = link.state
            self.shown.append(link.state)
        self.update(text)
