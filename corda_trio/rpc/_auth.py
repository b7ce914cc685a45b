"""RPC users: argon2 password hashes and their verification.

Verifying an argon2id hash costs about a third of a second of CPU and 64 MiB on purpose, so it runs on a
worker thread (at most :data:`VERIFY_THREADS` at once) and never on the event loop. A login that is cancelled
(the client went away, the node stops) does not wait for its check: the thread is left to finish on its own
and keeps its place among the :data:`VERIFY_THREADS` until it does. A successful check is
remembered for the life of the process as an HMAC of the password under a random per-process key, so a
client that reconnects often does not pay the full cost each time; failed checks are never remembered, so
guessing a password always pays it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable, Mapping
from typing import Final, final

import argon2
import attrs
import trio

__all__ = [
    "MAX_HASH_MEMORY_KIB",
    "MAX_HASH_PARALLELISM",
    "MAX_HASH_WORK",
    "RpcUser",
    "UserDatabase",
    "check_password_hash",
    "hash_password",
]

#: Password checks running at once (each holds 64 MiB for ~0.3 s with argon2-cffi's default profile).
VERIFY_THREADS: Final[int] = 2

_HASHER: Final = argon2.PasswordHasher()  # RFC 9106 "low memory" profile: argon2id, t=3, m=64 MiB, p=4


#: A configured hash may ask at most this much memory per check (KiB: 256 MiB, four times the default) ...
MAX_HASH_MEMORY_KIB: Final[int] = 256 * 1024
#: ... and at most this much work, memory times passes (KiB: four times the default's 64 MiB x 3). Every
#: login attempt for the user pays it, whoever makes it, so a hash beyond these would let anyone who can
#: reach the RPC port tie up the checks (and gigabytes) with wrong passwords.
MAX_HASH_WORK: Final[int] = 4 * 65536 * 3
#: ... and at most this many lanes: the check runs one thread per lane for each of its 4 slices of each
#: pass, so m=65536,t=3,p=8192 (within both bounds above) took 3.7 s a check instead of 0.16 s. p=64 costs
#: no more than p=4; RFC 9106 recommends 4, other tools make 1 to the number of cores.
MAX_HASH_PARALLELISM: Final[int] = 64


def check_password_hash(password_hash: str) -> None:
    """Refuse a ``password_hash`` that is not an argon2 hash or that costs too much to check.

    Raises:
        ValueError: why (for the configuration's error line).
    """
    if not password_hash.startswith("$argon2"):
        raise ValueError(
            "must be an argon2 hash (`corda-trio node hash-password` makes one); never a plain password"
        )
    try:
        params = argon2.extract_parameters(password_hash)
    except argon2.exceptions.InvalidHashError:
        raise ValueError("is not a valid argon2 hash (`corda-trio node hash-password` makes one)") from None
    if params.memory_cost > MAX_HASH_MEMORY_KIB or params.memory_cost * params.time_cost > MAX_HASH_WORK:
        raise ValueError(
            f"asks m={params.memory_cost} KiB and t={params.time_cost} passes per check: at most "
            f"m={MAX_HASH_MEMORY_KIB} and m*t={MAX_HASH_WORK} (every login attempt pays it; "
            "`corda-trio node hash-password` makes m=65536, t=3)"
        )
    if params.parallelism > MAX_HASH_PARALLELISM:
        raise ValueError(
            f"asks p={params.parallelism} lanes (one thread each) per check: at most p={MAX_HASH_PARALLELISM}"
            " (every login attempt pays it; `corda-trio node hash-password` makes p=4)"
        )


def hash_password(password: str) -> str:
    """An argon2id hash of ``password`` for ``[[rpc.users]] password_hash``."""
    if not password:
        raise ValueError("an empty password cannot be used")
    return _HASHER.hash(password)


@final
@attrs.frozen(kw_only=True)
class RpcUser:
    """An RPC user: name, argon2 hash of the password (never the password) and permissions."""

    username: str
    password_hash: str
    permissions: frozenset[str]


@attrs.define(eq=False)
class UserDatabase:
    """The users a server accepts (from the node's configuration)."""

    users: Mapping[str, RpcUser]
    _limiter: trio.CapacityLimiter = attrs.field(factory=lambda: trio.CapacityLimiter(VERIFY_THREADS))
    _key: bytes = attrs.field(factory=lambda: secrets.token_bytes(32))
    _verified: dict[str, bytes] = attrs.field(factory=dict)
    #: Checks in progress by (user, mac): concurrent logins with the same password share one check.
    _checking: dict[tuple[str, bytes], trio.Event] = attrs.field(factory=dict)

    @classmethod
    def of(cls, users: Iterable[RpcUser]) -> UserDatabase:
        return cls(users={u.username: u for u in users})

    def _mac(self, user: RpcUser, password: str) -> bytes:
        message = user.password_hash.encode() + b"\0" + password.encode("utf-8", "surrogatepass")
        return hmac.new(self._key, message, hashlib.sha256).digest()

    async def authenticate(self, username: object, password: object) -> RpcUser | None:
        """The user if ``password`` is theirs, else ``None`` (unknown users cost as much as known ones)."""
        if not isinstance(username, str) or not isinstance(password, str) or not password:
            await trio.lowlevel.checkpoint()
            return None
        user = self.users.get(username)
        if user is None:
            await trio.to_thread.run_sync(
                _verify, _DUMMY_HASH, password, limiter=self._limiter, abandon_on_cancel=True
            )
            return None
        mac = self._mac(user, password)
        while (running := self._checking.get((username, mac))) is not None:
            await running.wait()  # the same password is being checked: share the answer
        remembered = self._verified.get(username)
        if remembered is not None and hmac.compare_digest(remembered, mac):
            await trio.lowlevel.checkpoint()
            return user
        done = self._checking[username, mac] = trio.Event()
        try:
            ok = await trio.to_thread.run_sync(
                _verify, user.password_hash, password, limiter=self._limiter, abandon_on_cancel=True
            )
            if ok:
                self._verified[username] = mac
        finally:
            del self._checking[username, mac]
            done.set()
        return user if ok else None


def _verify(password_hash: str, password: str) -> bool:
    try:
        return _HASHER.verify(password_hash, password)
    except (argon2.exceptions.VerificationError, argon2.exceptions.InvalidHashError):
        return False


#: Checked against when the user does not exist, so that the answer takes as long as for a real user.
_DUMMY_HASH: Final[str] = (
    "$argon2id$v=19$m=65536,t=3,p=4$c29tZXNhbHRzb21lc2FsdA$BF1W3mlRqpcOHu3hdnttsiZm1NTwq3z9XgO6kgmKBrQ"
)
