"""Authenticating weaved to node daemons on other hosts: munge, then a MAC per message.

Every Slurm site runs munge (its daemons authenticate to each other with it), so a
node daemon trusts what munge says about who is calling, as slurmd does:

1. The daemon sends a fresh random nonce.
2. The client makes a munge credential whose payload holds that nonce and a fresh
   random session key. munge encrypts the payload, stamps it with the caller's uid
   and refuses to decode it twice (replay), so only that connection can use it.
3. The daemon decodes it (``munge_decode``), checks the nonce and that the uid is
   weaved's (``trusted_uids``), and keeps the key for the connection.
4. From then on every line either side sends is ``<seq> <hmac> <json>``: an
   HMAC-SHA256 under the session key over the sequence number and the JSON, the
   sequence counting up from 0 in each direction. A line with a bad MAC or an
   unexpected sequence number ends the connection.

One munge round trip per connection (weaved keeps its connections), not per request:
the runner polls running phases every few milliseconds.

:class:`Munge` binds ``libmunge.so.2`` with ctypes (no process per credential); the
socket of the local munged is ``MUNGE_SOCKET`` or munge's default.
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass
from typing import Any

from weave_slurm.errors import AuthError, ConfigError, StateError

_OPT_SOCKET = 8                  # MUNGE_OPT_SOCKET (munge.h)
_ERR_REPLAYED = 17               # EMUNGE_CRED_REPLAYED
MUNGE_SOCKET_ENV = "MUNGE_SOCKET"
NONCE_BYTES = 16
KEY_BYTES = 32


@dataclass(frozen=True)
class Credential:
    """What munge vouches for: the encoding process's uid and gid, and the payload."""

    uid: int
    gid: int
    payload: bytes


class Munge:
    """The local munged through libmunge (``socket``: its socket; None = default)."""

    def __init__(self, socket: str | None = None) -> None:
        try:
            self._lib = ctypes.CDLL("libmunge.so.2")
        except OSError as exc:
            raise ConfigError(f"libmunge.so.2 cannot be loaded ({exc}); install munge "
                              "(Debian: apt-get install munge)") from None
        self.socket = socket or os.environ.get(MUNGE_SOCKET_ENV) or None
        lib = self._lib
        lib.munge_ctx_create.restype = ctypes.c_void_p
        lib.munge_ctx_destroy.argtypes = [ctypes.c_void_p]
        lib.munge_ctx_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p]
        lib.munge_encode.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_void_p,
                                     ctypes.c_void_p, ctypes.c_int]
        lib.munge_decode.argtypes = [ctypes.c_char_p, ctypes.c_void_p,
                                     ctypes.POINTER(ctypes.c_void_p),
                                     ctypes.POINTER(ctypes.c_int),
                                     ctypes.POINTER(ctypes.c_uint),
                                     ctypes.POINTER(ctypes.c_uint)]
        lib.munge_strerror.restype = ctypes.c_char_p
        lib.munge_ctx_strerror.restype = ctypes.c_char_p
        lib.munge_ctx_strerror.argtypes = [ctypes.c_void_p]
        libc = ctypes.CDLL(None)
        libc.free.argtypes = [ctypes.c_void_p]
        self._free = libc.free

    def _ctx(self) -> int:
        ctx = self._lib.munge_ctx_create()
        if not ctx:
            raise StateError("munge: cannot create a context (out of memory)")
        if self.socket is not None:
            err = self._lib.munge_ctx_set(ctx, _OPT_SOCKET, self.socket.encode())
            if err:
                self._lib.munge_ctx_destroy(ctx)
                raise ConfigError(f"munge socket {self.socket!r}: "
                                  f"{self._lib.munge_strerror(err).decode()}")
        return int(ctx)

    def _error(self, ctx: int, err: int, what: str) -> str:
        detail = self._lib.munge_ctx_strerror(ctx) or self._lib.munge_strerror(err)
        where = f" (socket {self.socket})" if self.socket else ""
        return f"munge {what}{where}: {detail.decode()}"

    def encode(self, payload: bytes) -> str:
        """A credential carrying ``payload``, stamped with this process's uid."""
        ctx = self._ctx()
        cred = ctypes.c_char_p()
        try:
            err = self._lib.munge_encode(ctypes.byref(cred), ctx, payload, len(payload))
            if err:   # no munged where weaved looks, or it refuses: no credential at all
                raise AuthError(self._error(ctx, err, "encode"))
            assert cred.value is not None
            return cred.value.decode()
        finally:
            if cred:
                self._free(ctypes.cast(cred, ctypes.c_void_p))
            self._lib.munge_ctx_destroy(ctx)

    def decode(self, credential: str) -> Credential:
        """Check a credential: its encoder's uid/gid and payload (``AuthError`` if not
        valid: forged, expired, replayed, from another munge key)."""
        ctx = self._ctx()
        buf, length = ctypes.c_void_p(), ctypes.c_int()
        uid, gid = ctypes.c_uint(), ctypes.c_uint()
        try:
            err = self._lib.munge_decode(credential.encode(), ctx, ctypes.byref(buf),
                                         ctypes.byref(length), ctypes.byref(uid),
                                         ctypes.byref(gid))
            if err:
                what = "refused a replayed credential" if err == _ERR_REPLAYED else "decode"
                raise AuthError(self._error(ctx, err, what))
            payload = ctypes.string_at(buf.value, length.value) if buf.value else b""
            return Credential(uid.value, gid.value, payload)
        finally:
            if buf.value:
                self._free(buf)
            self._lib.munge_ctx_destroy(ctx)


class Session:
    """The signed line framing of one authenticated connection (both directions)."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._send_seq = 0
        self._recv_seq = 0

    def seal(self, obj: dict[str, Any]) -> bytes:
        body = json.dumps(obj, separators=(",", ":"))
        seq = self._send_seq
        self._send_seq += 1
        return f"{seq} {self._mac(seq, body)} {body}\n".encode()

    def open(self, line: bytes) -> dict[str, Any]:
        """A received line's JSON object; ``AuthError`` unless its MAC and sequence
        number are right."""
        try:
            seq_s, mac, body = line.decode().rstrip("\n").split(" ", 2)
            seq = int(seq_s)
        except ValueError:
            raise AuthError("a message is not '<seq> <mac> <json>'") from None
        if seq != self._recv_seq:
            raise AuthError(f"message {seq} out of order (expected {self._recv_seq})")
        if not hmac.compare_digest(mac, self._mac(seq, body)):
            raise AuthError(f"message {seq} has a bad MAC: not signed with this session")
        self._recv_seq += 1
        obj = json.loads(body)
        if not isinstance(obj, dict):
            raise AuthError(f"message {seq} is not a JSON object")
        return obj

    def _mac(self, seq: int, body: str) -> str:
        return hmac.new(self._key, f"{seq}:{body}".encode(), hashlib.sha256).hexdigest()


def new_nonce() -> str:
    return secrets.token_hex(NONCE_BYTES)


def client_hello(munge: Munge, nonce: str, purpose: str) -> tuple[str, Session]:
    """The credential answering the daemon's ``nonce``, and the session it opens."""
    key = secrets.token_bytes(KEY_BYTES)
    payload = json.dumps({"nonce": nonce, "key": key.hex(), "purpose": purpose}).encode()
    return munge.encode(payload), Session(key)


def server_accept(munge: Munge, nonce: str, credential: str, purpose: str,
                  trusted_uids: frozenset[int]) -> tuple[int, Session]:
    """Check the client's credential against our ``nonce``; its uid and the session."""
    cred = munge.decode(credential)
    try:
        hello = json.loads(cred.payload)
        key = bytes.fromhex(str(hello["key"]))
    except (ValueError, KeyError, TypeError):
        raise AuthError("the munge credential does not carry a session key") from None
    if not hmac.compare_digest(str(hello.get("nonce")), nonce):
        raise AuthError("the munge credential answers another connection's nonce")
    if hello.get("purpose") != purpose:
        raise AuthError(f"the munge credential is for {hello.get('purpose')!r}, not "
                        f"{purpose!r}")
    if cred.uid not in trusted_uids:
        raise AuthError(f"uid {cred.uid} may not control this node daemon (trusted: "
                        f"{', '.join(str(u) for u in sorted(trusted_uids))})")
    if len(key) != KEY_BYTES:
        raise AuthError("the munge credential's session key has the wrong length")
    return cred.uid, Session(key)
