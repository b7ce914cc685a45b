"""Node processes for benchmarks, driven from above as an operator would: the ``corda-trio`` command line.

``bootstrap`` runs ``corda-trio network bootstrap`` (directory mode) and adds an RPC user to every
``node.toml``; :class:`NodeProcess` runs ``corda-trio node start`` and waits for its ready line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import trio

from corda_trio import rpc

__all__ = ["NodeProcess", "bootstrap"]


def bootstrap(directory: Path, names: list[str], *, user: str, password: str) -> list[Path]:
    """A network of ``names`` in ``directory`` whose nodes have RPC user ``user`` (admin); returns the node
    directories in the order of ``names``."""
    command = [
        sys.executable,
        "-m",
        "corda_trio",
        "network",
        "bootstrap",
        "--dir",
        str(directory),
        "--no-map",
    ]
    for name in names:
        command += ["--node", name]
    subprocess.run(command, check=True, capture_output=True)
    hashed = rpc.hash_password(password)
    dirs = []
    for name in names:
        org = name.split("O=", 1)[1].split(",", 1)[0].lower()
        node_dir = directory / "nodes" / org
        with open(node_dir / "node.toml", "a", encoding="utf-8") as f:
            f.write(
                f'\n[[rpc.users]]\nusername = "{user}"\npassword_hash = "{hashed}"\npermissions = ["admin"]\n'
            )
        dirs.append(node_dir)
    return dirs


class NodeProcess:
    """``corda-trio node start --base-dir D`` in a child process."""

    def __init__(self, process: trio.Process, node_dir: Path) -> None:
        self.process = process
        self.node_dir = node_dir
        self.addresses: dict[str, Any] = json.loads((node_dir / "node.json").read_text())

    @property
    def rpc_url(self) -> str:
        return str(self.addresses["rpc"])

    @classmethod
    async def start(cls, node_dir: Path, *, bytecode_cache: Path | None = None) -> NodeProcess:
        """Start the node and wait for its ready line.

        ``bytecode_cache``: compiled modules are kept there (``PYTHONPYCACHEPREFIX``) even if the
        environment says not to write them (``PYTHONDONTWRITEBYTECODE``, as some CI machines set it): an
        installed node starts from compiled modules, and a start-up benchmark should not measure compiling
        the sources.
        """
        env = dict(os.environ)
        if bytecode_cache is not None:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = str(bytecode_cache)
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "corda_trio", "node", "start", "--base-dir", str(node_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        assert process.stdout is not None
        seen = b""
        with trio.move_on_after(60):
            while b"node ready:" not in seen:
                chunk = await process.stdout.receive_some(4096)
                if not chunk:
                    break
                seen += chunk
        if b"node ready:" not in seen:
            process.kill()
            await process.wait()
            raise SystemExit(f"node in {node_dir} did not start: {seen.decode(errors='replace')}")
        return cls(process, node_dir)

    async def stop(self) -> int:
        """SIGTERM, then wait (SIGKILL after 30 s); returns the exit code."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            with trio.move_on_after(30):
                await self.process.wait()
            if self.process.returncode is None:
                self.process.kill()
        with trio.CancelScope(shield=True):
            return await self.process.wait()
