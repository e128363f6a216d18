"""Three round trips fewer in every login: no "none" probe, no unsigned query for a key
held in memory, no wait for the user-auth service's acceptance.

Why: asyncssh (2.x) logs in with three requests, each waiting for the host's answer:
``none`` (to learn the host's methods), then for each key an unsigned ``publickey``
query (is this key welcome?), then the signed request. On a far link each is a round
trip, and before them the wait for the service's acceptance: at 80 ms, 0.32 s of the
0.5 s a connection took (6.2 round trips through the fault proxy, 3.2 with this:
``scripts/bench_login.py``; docs/figures.md, "The login's round trips").

- The ``none`` request only asks which methods the host takes. remotemac offers the
  methods it was configured with (``preferred_auth``, "publickey") and nothing else, so
  it starts with them: a host that refuses them answers with a failure that names its
  methods, exactly what ``none`` would have said, and the login fails the same way
  (``PermissionDenied``, then remotemac's AuthError with its hint). A host that lets
  ``none`` in without a key is no longer logged into that way: remotemac asked for
  public-key login only.
- The unsigned query exists so a client need not sign with a key the host will not
  take. For a key whose private half is here in memory (an identity file remotemac
  loaded: ``asyncssh.SSHLocalKeyPair``), signing costs a millisecond and asks nothing
  of the user, so the signed request goes at once, as OpenSSH's client itself does for
  identity files it loads without a public half (``sshconnect2.c``,
  ``sign_and_send_pubkey``). The signature covers the session identifier, which binds it
  to this connection and to the host key already checked against ``known_hosts``
  (strict), so it is worth nothing anywhere else; the host learns that the key is held,
  which the query told it anyway. Keys from an ssh-agent, a PKCS#11 token or a security
  key (``sk-`` types: a touch for each signature) keep the query: a signature there may
  prompt the user, and the query is what spares them one for a key the host refuses.
  A key the host refuses is answered with a failure, and asyncssh goes on to the next
  key as after a refused query; sshd counts both the same against ``MaxAuthTries``.

- asyncssh asks for the user-auth service and waits for its acceptance before the
  first login request. OpenSSH's sshd reads its packets in order and takes login
  requests from the moment it has accepted the service, so the first request can
  follow the service request at once (the packets still go in the order RFC 4252
  gives; only the wait between them goes). It is sent once the host's extension info
  (``server-sig-algs``, which picks an RSA key's signature) has been read, which
  OpenSSH sends with the end of the key exchange, and only to a host whose version
  says OpenSSH; to any other, or with no extension info, the login waits for the
  acceptance as asyncssh's own does. The acceptance, when it comes, is checked as
  before and only not answered with a second start of the login.

It plugs in per connection from the client's ``connection_made`` (instance attributes,
as ignorepackets.py does), so asyncssh's code is not touched; if a later asyncssh lacks
the private attributes it reads, the login goes as asyncssh's own.
"""

from __future__ import annotations

from typing import Any

from asyncssh.packet import Boolean, String
from asyncssh.public_key import SSHLocalKeyPair

#: the SSH message numbers (RFC 4250, RFC 8308)
MSG_SERVICE_ACCEPT = 6
MSG_EXT_INFO = 7
USERAUTH_SERVICE = b"ssh-userauth"

#: the wire form of the "has signature" flag of a publickey request (RFC 4252 section 7)
UNSIGNED = Boolean(False)
SIGNED = Boolean(True)


def signs_silently(keypair: Any) -> bool:
    """True for a key whose private half is in this process and whose signature needs
    nobody (no agent, token or security key to ask)."""
    return isinstance(keypair, SSHLocalKeyPair) and not bytes(
        getattr(keypair, "algorithm", b"")
    ).startswith(b"sk-")


def fast_login(conn: Any) -> None:
    """Set ``conn`` (an asyncssh.SSHClientConnection, before its login) to start with its
    configured methods, to sign at once with keys that sign silently, and to send its
    first login request behind the service request to an OpenSSH host."""
    preferred = getattr(conn, "_preferred_auth", None)
    methods = getattr(conn, "_auth_methods", None)
    if not preferred or methods != [b"none"] or not hasattr(conn, "send_userauth_request"):
        return  # not the asyncssh this was written against: its own login
    conn._auth_methods = list(preferred)
    _sign_key_files_at_once(conn)
    _login_behind_the_service_request(conn)


def _sign_key_files_at_once(conn: Any) -> None:
    original = conn.send_userauth_request

    async def send_userauth_request(
        method: bytes, *args: bytes, key: Any = None, **kwargs: Any
    ) -> None:
        # (other keywords passed through as given: a later asyncssh may add some)
        auth = getattr(conn, "_auth", None)
        keypair = getattr(auth, "_keypair", None)
        if (
            method == b"publickey"
            and key is None
            and set(kwargs) <= {"trivial"}
            and len(args) == 3
            and args[0] == UNSIGNED
            and keypair is not None
            and args[1:] == (String(keypair.algorithm), String(keypair.public_data))
            and signs_silently(keypair)
        ):
            try:
                await original(method, SIGNED, *args[1:], key=keypair, trivial=False)
            except ValueError:  # the key cannot sign: the next one, as asyncssh does
                conn.try_next_auth()
            return
        await original(method, *args, key=key, **kwargs)

    conn.send_userauth_request = send_userauth_request


def _login_behind_the_service_request(conn: Any) -> None:
    """Start the login as the host's extension info arrives, not on the service's
    acceptance (OpenSSH hosts only; see the module's docstring)."""
    handlers = getattr(conn, "_packet_handlers", None)
    if not (
        isinstance(handlers, dict)
        and MSG_EXT_INFO in handlers
        and MSG_SERVICE_ACCEPT in handlers
        and hasattr(conn, "try_next_auth")
    ):
        return
    ext_info, accept = handlers[MSG_EXT_INFO], handlers[MSG_SERVICE_ACCEPT]
    started = [False]

    def on_ext_info(self: Any, pkttype: int, pktid: int, packet: Any) -> Any:
        result = ext_info(self, pkttype, pktid, packet)
        if (
            not started[0]
            and getattr(self, "_next_service", None) == USERAUTH_SERVICE
            and not getattr(self, "_auth_in_progress", True)
            and not getattr(self, "_auth_complete", True)
            and b"OpenSSH_" in bytes(getattr(self, "_server_version", b""))
        ):
            started[0] = True
            self._auth_in_progress = True
            self.try_next_auth()
        return result

    def on_accept(self: Any, pkttype: int, pktid: int, packet: Any) -> Any:
        if not started[0]:
            return accept(self, pkttype, pktid, packet)
        # asyncssh's own checks of the acceptance, without its start of the login
        own = "try_next_auth" in vars(self)
        restart = self.try_next_auth
        self.try_next_auth = lambda **_kw: None
        try:
            return accept(self, pkttype, pktid, packet)
        finally:
            if own:
                self.try_next_auth = restart
            else:
                del self.try_next_auth

    conn._packet_handlers = {**handlers, MSG_EXT_INFO: on_ext_info, MSG_SERVICE_ACCEPT: on_accept}
