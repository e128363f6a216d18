"""Reusable test harness: a real OpenSSH sshd on loopback and a fault proxy.

Later tests (tmux jobs over ssh, many hosts at once) start sshd instances with
:func:`tests.harness.sshd.start_sshd` or the fixtures in
:mod:`tests.harness.fixtures`, and put a :class:`tests.harness.faultproxy.FaultProxy`
in front of one to cut, reset, blackhole or slow its link.
"""

from tests.harness.faultproxy import FaultProxy
from tests.harness.sshd import SSHD, ClientKey, start_sshd

__all__ = ["SSHD", "ClientKey", "FaultProxy", "start_sshd"]
