"""``corda-trio node hash-password``: the hash it prints is one ``[[rpc.users]] password_hash`` takes and
that verifies the password; a missing password is one line, exit 2."""

from __future__ import annotations

import os
import subprocess

import argon2
import pytest

from corda_trio import rpc

from .cli_helpers import CLI


def _hash_password(
    env: dict[str, str], stdin: int | None = subprocess.DEVNULL
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "node", "hash-password", "--password-env", "CT_HASH_PW"],
        capture_output=True, text=True, env=env, stdin=stdin, timeout=60,
    )  # fmt: skip


def test_the_printed_hash_verifies_the_password_and_passes_the_config_check() -> None:
    done = _hash_password({**os.environ, "CT_HASH_PW": "correct horse"})
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    rpc.check_password_hash(line)  # what node.toml's [[rpc.users]] password_hash is held to
    assert argon2.PasswordHasher().verify(line, "correct horse")
    with pytest.raises(argon2.exceptions.VerifyMismatchError):
        argon2.PasswordHasher().verify(line, "wrong horse")


@pytest.mark.parametrize(
    ("value", "message"),
    [(None, "$CT_HASH_PW is not set"), ("", "$CT_HASH_PW is empty")],  # (an empty one was 'not set' too)
)
def test_a_variable_unset_or_empty_is_one_line_and_exit_2(value: str | None, message: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CT_HASH_PW"}
    if value is not None:
        env["CT_HASH_PW"] = value
    done = _hash_password(env)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [f"corda-trio: error: {message}"]


def test_without_the_variable_or_a_terminal_it_says_what_to_give() -> None:
    done = subprocess.run(
        [*CLI, "node", "hash-password"], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "corda-trio: error: give --password-env VAR or run from a terminal to be prompted"
    ]
