"""``node.toml``: what a good file gives, and a table of bad files with the one-line error each gives."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from corda_trio import flows, rpc, transport
from corda_trio.bridge import float as float_
from corda_trio.node import _config

HASH = rpc.hash_password("correct horse")

GOOD = f"""
legal_name = "O=Alice, L=London, C=GB"

[p2p]
address = "127.0.0.1:40001"

[rpc]
address = "127.0.0.1:40002"

[[rpc.users]]
username = "ops"
password_hash = "{HASH}"
permissions = ["admin"]

[[rpc.users]]
username = "app"
password_hash = "{HASH}"
permissions = ["read", "start_flow:PingPong"]

[metrics]
address = "127.0.0.1:0"

[keys]
passphrase_env = "CORDA_TRIO_KEY_PASSPHRASE"

[store]
fsync = "none"
commit_process = false

[bridge]
mode = "in-process"

[logging]
format = "json"
level = "debug"
file = "var/log/alice.log"

[shutdown]
timeout_seconds = 2.5

[flows]
max_responders_per_peer = 500
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_good_config_round_trips(tmp_path: Path) -> None:
    cfg = _config.load_node_config(_write(tmp_path, GOOD))
    assert str(cfg.legal_name) == "O=Alice, L=London, C=GB"
    assert [u.username for u in cfg.rpc_users] == ["ops", "app"]
    assert cfg.rpc_users[1].permissions == {"read", "start_flow:PingPong"}
    assert cfg.metrics_address == ("127.0.0.1", 0)
    assert cfg.log_format is _config.LogFormat.JSON and cfg.log_level == "debug"
    assert cfg.log_path == tmp_path / "var" / "log" / "alice.log"
    assert cfg.shutdown_timeout_seconds == 2.5 and not cfg.store_commit_process
    assert cfg.bridge_mode is _config.BridgeMode.IN_PROCESS
    # dump -> load gives the same configuration
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "node.toml").write_text(_config.dump_node_config(cfg, copy), encoding="utf-8")
    reloaded = _config.load_node_config(copy / "node.toml")
    assert reloaded.base_directory == cfg.base_directory
    assert reloaded.rpc_users == cfg.rpc_users
    assert reloaded.log_path == cfg.log_path and reloaded.metrics_address == cfg.metrics_address
    assert reloaded.store_fsync == cfg.store_fsync and reloaded.shutdown_timeout_seconds == 2.5
    assert cfg.flows_max_responders_per_peer == reloaded.flows_max_responders_per_peer == 500
    # the default, when [flows] is left out
    default = _config.load_node_config(_write(tmp_path, _replace("max_responders_per_peer = 500", "")))
    assert default.flows_max_responders_per_peer == flows.DEFAULT_MAX_RESPONDERS_PER_PEER == 10_000


FLOAT = """
[float]
control = ["10.0.0.5:10010"]
tunnel_cert = "b.pem"
tunnel_key = "b.key"
tunnel_ca = "ca.pem"
"""


def test_float_and_proxy_settings_load_and_round_trip(tmp_path: Path) -> None:
    text = _replace('mode = "in-process"', 'proxy = "socks5://corda@[::1]:1080"\nproxy_password_env = "P"')
    path = _write(tmp_path, text + FLOAT.replace('"10.0.0.5:10010"', '"10.0.0.5:10010", "10.0.0.6:10010"'))
    cfg = _config.load_node_config(path)
    assert cfg.bridge_proxy is not None and cfg.bridge_proxy_password is not None
    assert (cfg.bridge_proxy.version, cfg.bridge_proxy.host, cfg.bridge_proxy.port) == ("socks5", "::1", 1080)
    assert cfg.bridge_proxy.username == "corda" and cfg.bridge_proxy_password.env == "P"
    assert cfg.floats is not None
    assert [str(a) for a in cfg.floats.control] == ["10.0.0.5:10010", "10.0.0.6:10010"]
    assert cfg.floats.tunnel_ca == tmp_path / "ca.pem" and cfg.floats.tls_ref == "node"
    again = _write(tmp_path, _config.dump_node_config(cfg, tmp_path))
    assert _config.load_node_config(again) == cfg
    plain = _config.load_node_config(_write(tmp_path, GOOD))
    assert plain.floats is None and plain.bridge_proxy is None


def test_idle_and_tunnel_handshake_timeouts_load_round_trip_and_default(tmp_path: Path) -> None:
    """``[p2p] idle_timeout_seconds`` and ``[float] idle_timeout_seconds`` / ``handshake_timeout_seconds``:
    an operator with a WAN or DMZ sets how soon a silent peer or float is given up (they were fixed at 10 s,
    and a frozen standby float cost every failover the peers' 10 s handshake timeout)."""
    text = _replace("[p2p]", "[p2p]\nidle_timeout_seconds = 2.5") + FLOAT + "idle_timeout_seconds = 30\n"
    text += "handshake_timeout_seconds = 1.5\n"
    cfg = _config.load_node_config(_write(tmp_path, text))
    assert cfg.p2p_idle_timeout_seconds == 2.5
    assert cfg.floats is not None
    assert (cfg.floats.idle_timeout_seconds, cfg.floats.handshake_timeout_seconds) == (30.0, 1.5)
    again = _write(tmp_path, _config.dump_node_config(cfg, tmp_path))
    assert _config.load_node_config(again) == cfg
    plain = _config.load_node_config(_write(tmp_path, GOOD + FLOAT))
    assert plain.p2p_idle_timeout_seconds == transport.DEFAULT_IDLE_TIMEOUT_SECONDS == 10.0
    assert plain.floats is not None and plain.floats.idle_timeout_seconds == 10.0
    assert plain.floats.handshake_timeout_seconds == float_.DEFAULT_TUNNEL_HANDSHAKE_TIMEOUT_SECONDS == 3.0


def test_p2p_advertise_lists_the_nodeinfo_addresses_in_order_and_round_trips(tmp_path: Path) -> None:
    """``[p2p] advertise``: several public addresses (two floats on two hosts), with or without ``[float]``;
    left out, the NodeInfo lists ``p2p.address`` alone."""
    plain = _config.load_node_config(_write(tmp_path, GOOD))
    assert plain.p2p_advertise == () and [str(a) for a in plain.advertised_addresses] == ["127.0.0.1:40001"]
    listed = '[p2p]\nadvertise = ["float-b.example.com:10002", "[2001:db8::1]:10002", "float-a:10002"]'
    for text in (_replace("[p2p]", listed), _replace("[p2p]", listed) + FLOAT):
        cfg = _config.load_node_config(_write(tmp_path, text))
        assert [str(a) for a in cfg.advertised_addresses] == [
            "float-b.example.com:10002", "[2001:db8::1]:10002", "float-a:10002"
        ]  # fmt: skip
        assert str(cfg.p2p_address) == "127.0.0.1:40001"  # (still the default listen address)
        again = _write(tmp_path, _config.dump_node_config(cfg, tmp_path))
        assert _config.load_node_config(again) == cfg
    most = ", ".join(f'"h{i}:1"' for i in range(16))
    cfg = _config.load_node_config(_write(tmp_path, _replace("[p2p]", f"[p2p]\nadvertise = [{most}]")))
    assert len(cfg.advertised_addresses) == 16


def _replace(old: str, new: str) -> str:
    assert old in GOOD, old
    return GOOD.replace(old, new, 1)


BAD = [
    (_replace('legal_name = "O=Alice, L=London, C=GB"', ""), "legal_name: is required"),
    (_replace("O=Alice, L=London, C=GB", "Alice"), "legal_name:"),
    (GOOD + "\ncolour = 1\n", "colour: unknown setting"),
    (_replace("[p2p]", "[p2p]\nport = 1"), "p2p.port: unknown setting"),
    (
        _replace("[p2p]", "[p2p]\nidle_timeout_seconds = 0.5"),
        "p2p.idle_timeout_seconds: must be a number of seconds in 1..3600, got 0.5",
    ),
    (_replace("[p2p]", '[p2p]\nidle_timeout_seconds = "10"'), "p2p.idle_timeout_seconds: must be a number"),
    (_replace("[p2p]", "[p2p]\nidle_timeout_seconds = true"), "p2p.idle_timeout_seconds: must be a number"),
    (
        GOOD + FLOAT + "idle_timeout_seconds = 3601\n",
        "float.idle_timeout_seconds: must be a number of seconds",
    ),
    (
        GOOD + FLOAT + "handshake_timeout_seconds = 0\n",
        "float.handshake_timeout_seconds: must be a number of ",
    ),
    (GOOD + FLOAT + "handshake_timeout_seconds = nan\n", "float.handshake_timeout_seconds: must be a number"),
    (_replace('address = "127.0.0.1:40001"', 'address = "127.0.0.1"'), "p2p.address: expected HOST:PORT"),
    (_replace('address = "127.0.0.1:40002"', 'address = "127.0.0.1:99999"'), "rpc.address: port must be"),
    (_replace('username = "app"', 'username = "ops"'), "rpc.users[1].username: user 'ops' is defined twice"),
    (
        _replace(f'password_hash = "{HASH}"', 'password_hash = "hunter2"'),
        "rpc.users[0].password_hash: must be an argon2 hash",
    ),
    (
        _replace('permissions = ["admin"]', 'permissions = ["root"]'),
        "rpc.users[0].permissions: unknown permission 'root'",
    ),
    (
        _replace('permissions = ["admin"]', "permissions = []"),
        "rpc.users[0].permissions: must be a non-empty array",
    ),
    (
        _replace('username = "ops"', 'username = "ops"\npassword = "x"'),
        "rpc.users[0].password: unknown setting",
    ),
    (_replace('address = "127.0.0.1:0"', 'address = "localhost"'), "metrics.address: expected HOST:PORT"),
    (_replace('fsync = "none"', 'fsync = "sometimes"'), 'store.fsync: must be "always" or "none"'),
    (
        _replace("commit_process = false", 'commit_process = "no"'),
        "store.commit_process: must be true or false",
    ),
    (_replace('mode = "in-process"', 'mode = "float"'), 'bridge.mode: must be "in-process" or "external"'),
    (_replace('format = "json"', 'format = "xml"'), 'logging.format: must be "text" or "json"'),
    (_replace('level = "debug"', 'level = "loud"'), "logging.level: must be"),
    (_replace("timeout_seconds = 2.5", "timeout_seconds = -1"), "shutdown.timeout_seconds: must be a number"),
    (
        _replace("max_responders_per_peer = 500", "max_responders_per_peer = 0"),
        "flows.max_responders_per_peer: must be an integer in 1..1000000, got 0",
    ),
    (
        _replace("max_responders_per_peer = 500", 'max_responders_per_peer = "500"'),
        "flows.max_responders_per_peer: must be an integer in 1..1000000, got '500'",
    ),
    (_replace("max_responders_per_peer = 500", "max_flows = 5"), "flows.max_flows: unknown setting"),
    (_replace('passphrase_env = "CORDA_TRIO_KEY_PASSPHRASE"', ""), "keys: exactly one of"),
    (GOOD + '\n[network]\nmap_url = "https://x"\n', "network.map_url: must be an http:// URL"),
    # a NUL in a path made open() / stat() raise ValueError: a traceback instead of one line
    (_replace('file = "var/log/alice.log"', 'file = "log\\u0000"'), "logging.file: must not contain a NUL"),
    (GOOD + '\n[network]\ntrust_root = "r\\u0000.pem"\n', "network.trust_root: must not contain a NUL"),
    ('base_directory = ".\\u0000"\n' + GOOD, "base_directory: must be a non-empty path without NUL"),
    (GOOD + '\n[network]\nmap_url = "http://h\\u0000:1"\n', "network.map_url: must be an http:// URL"),
    (_replace('address = "127.0.0.1:40001"', 'address = "127.0.0.1\\u0000:40001"'), "p2p.address: must not"),
    ("legal_name = \n", "not valid TOML"),
    (_replace('mode = "in-process"', 'mode = "external"'), 'bridge: mode = "external" needs password_env'),
    (
        _replace('mode = "in-process"', 'mode = "external"\nendpoint = "10.0.0.1:5"\npassword_env = "X"'),
        "bridge.endpoint: must be a loopback address",
    ),
    (
        _replace('mode = "in-process"', 'mode = "external"\npassword_env = "X"\npassword_file = "f"'),
        "bridge: give exactly one of password_env and password_file",
    ),
    (
        _replace('mode = "in-process"', 'proxy = "http://p:3128"'),
        "bridge.proxy: must be socks5://[USER@]HOST:PORT",
    ),
    (_replace('mode = "in-process"', 'proxy = "socks5://p"'), "bridge.proxy: expected HOST:PORT"),
    (_replace('mode = "in-process"', 'proxy = "socks5://p:1080/x"'), "bridge.proxy: must be socks5://"),
    (_replace('mode = "in-process"', 'proxy = "socks5://u:pw@p:1080"'), "bridge.proxy: write no password in"),
    (_replace('mode = "in-process"', 'proxy_password_env = "P"'), "bridge: proxy_password_env / proxy_pass"),
    (
        _replace('mode = "in-process"', 'proxy = "socks4://u@p:1080"\nproxy_password_env = "P"'),
        "bridge: a proxy password needs a socks5:// proxy with a USER@",
    ),
    (
        _replace('mode = "in-process"', 'mode = "external"\npassword_env = "X"\nproxy = "socks5://p:1"'),
        'bridge.proxy: applies to mode = "in-process"',
    ),
    (GOOD + FLOAT.replace('["10.0.0.5:10010"]', "[]"), "float.control: must be a non-empty array"),
    (GOOD + FLOAT.replace('"10.0.0.5:10010"', '"10.0.0.5"'), "float.control[0]: expected HOST:PORT"),
    (GOOD + FLOAT.replace('"10.0.0.5:10010"', '"a:1", "a:1"'), "float.control[1]: a:1 is listed twice"),
    (GOOD + FLOAT.replace('tunnel_ca = "ca.pem"\n', ""), "float.tunnel_ca: is required"),
    (GOOD + FLOAT + "port = 1\n", "float.port: unknown setting"),
    (_replace("[p2p]", '[p2p]\nlisten = "0.0.0.0:1"') + FLOAT, "p2p.listen: not used behind a float"),
    (_replace("[p2p]", '[p2p]\nlisten = "0.0.0.0:\uff11"'), "p2p.listen: port in"),  # full-width 1
    (_replace("[p2p]", "[p2p]\nadvertise = []"), 'p2p.advertise: must be a non-empty array of "HOST:PORT"'),
    (_replace("[p2p]", '[p2p]\nadvertise = ["a:1", "b"]'), "p2p.advertise[1]: expected HOST:PORT, got 'b'"),
    (_replace("[p2p]", '[p2p]\nadvertise = ["a:1", "b:2", "A:1"]'), "p2p.advertise[2]: A:1 is listed twice"),
    (_replace("[p2p]", '[p2p]\nadvertise = ["a:0"]'), "p2p.advertise[0]: port must be in 1..65535"),
    (_replace("[p2p]", "[p2p]\nadvertise = [10002]"), 'p2p.advertise[0]: must be a "HOST:PORT" string'),
    (
        _replace("[p2p]", '[p2p]\nadvertise = ["a:1", "0.0.0.0:10002"]'),
        "p2p.advertise[1]: 0.0.0.0:10002 is not an address peers can dial",
    ),
    (_replace("[p2p]", '[p2p]\nadvertise = ["[::]:1"]'), "p2p.advertise[0]: [::]:1 is not an address peers"),
    # p2p.address is advertised (without p2p.advertise): a wildcard in any spelling is refused, and the
    # message says where a bind address goes
    *(
        (
            _replace('address = "127.0.0.1:40001"', f'address = "{wildcard}:40001"'),
            f"p2p.address: {wildcard}:40001 is not an address peers can dial: set the host:port they reach; "
            f'to listen on every interface, set p2p.listen = "{wildcard}:40001"',
        )
        for wildcard in ("0.0.0.0", "[::]", "0", "[::ffff:0.0.0.0]", "0x0.0")
    ),
    (
        _replace('address = "127.0.0.1:40001"', 'address = "0.0.0.0:10002"') + FLOAT,
        "p2p.address: 0.0.0.0:10002 is not an address peers can dial: set the host:port they reach",
    ),
    (
        _replace("[p2p]", "[p2p]\nadvertise = [" + ", ".join(f'"h{i}:1"' for i in range(17)) + "]"),
        "p2p.advertise: at most 16 addresses, got 17",
    ),
    (
        _replace('mode = "in-process"', 'mode = "external"\npassword_env = "X"') + FLOAT,
        'float: needs bridge.mode = "in-process"',
    ),
]


@pytest.mark.parametrize(("text", "expected"), BAD, ids=[e for _, e in BAD])
def test_bad_config_names_file_key_and_problem(tmp_path: Path, text: str, expected: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(_config.ConfigError) as info:
        _config.load_node_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    assert expected in message, message
    assert "\n" not in message


def test_cli_reports_a_bad_config_in_one_line_with_exit_2(tmp_path: Path) -> None:
    path = _write(tmp_path, _replace('level = "debug"', 'level = "loud"'))
    done = subprocess.run(
        [sys.executable, "-m", "corda_trio", "node", "start", "--config", str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f'corda-trio: error: {path}: logging.level: must be "debug" or "info" or "warning" or "error", '
        "got 'loud'"
    ]
    missing = subprocess.run(
        [sys.executable, "-m", "corda_trio", "node", "start", "--base-dir", str(tmp_path / "nope")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert missing.returncode == 2
    assert (
        missing.stderr.strip()
        == f"corda-trio: error: {tmp_path / 'nope' / 'node.toml'}: configuration file not found"
    )


def test_a_node_toml_saved_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    """A node.toml saved as 'UTF-8 with BOM' (Windows Notepad did so by default) was refused: 'not valid
    TOML: Invalid statement (at line 1, column 1)', a line and column where nothing is to be seen."""
    path = tmp_path / "node.toml"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD.encode())
    cfg = _config.load_node_config(path)
    assert str(cfg.legal_name) == "O=Alice, L=London, C=GB"


def test_a_passphrase_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "passphrase"
    path.write_bytes(b"\xeb\x01secret\n")
    path.chmod(0o600)
    with pytest.raises(_config.ConfigError) as info:
        _config.KeyPassphrase(file=path).read()
    assert str(info.value) == f"passphrase file {str(path)!r} is not UTF-8 text (byte 0)"


def test_a_passphrase_file_whose_path_holds_a_nul_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "pass\x00phrase"
    with pytest.raises(_config.ConfigError) as info:
        _config.KeyPassphrase(file=path).read()
    assert str(info.value) == f"passphrase file {str(path)!r}: a path cannot hold a NUL character"


def test_a_passphrase_variable_with_bytes_that_are_not_utf8_gives_those_bytes() -> None:
    # (os.environ holds such bytes as surrogate escapes, as Python decodes the environment)
    environ = {"PASS": b"\xebsecret".decode("utf-8", "surrogateescape")}
    assert _config.KeyPassphrase(env="PASS").read(environ) == b"\xebsecret"
    assert _config.KeyPassphrase(env="PASS").read({"PASS": "s3cret"}) == b"s3cret"


def test_rpc_commands_find_the_running_node_through_its_base_directory(tmp_path: Path) -> None:
    """``--config``: the running node's ``node.json`` in the base directory the file declares gives the RPC
    address (the port it really listens on), without loading the whole configuration; no ``node.json``
    (the node is not running): the configured address."""
    import argparse

    from corda_trio.node import _cli_node

    path = _write(tmp_path, 'base_directory = "base"\n' + GOOD)
    (tmp_path / "base").mkdir()
    args = argparse.Namespace(node=None, base_dir=None, config=path)
    assert _cli_node._rpc_url(args) == "ws://127.0.0.1:40002"
    (tmp_path / "base" / "node.json").write_text('{"rpc": "ws://127.0.0.1:40777"}')
    assert _cli_node._rpc_url(args) == "ws://127.0.0.1:40777"
    (tmp_path / "base" / "node.json").write_text("{half a file")  # being written: the configuration
    assert _cli_node._rpc_url(args) == "ws://127.0.0.1:40002"


# IPv6 and host names in node.toml: (key's old line, new line, expected problem or None when accepted)
ADDRESSES = [
    ('address = "127.0.0.1:40001"', 'address = "[::1]:40001"', None),
    ('address = "127.0.0.1:40001"', 'address = "[fe80::1%eth0]:40001"', None),
    ('address = "127.0.0.1:40001"', 'address = "[::ffff:127.0.0.1]:40001"', None),
    ('address = "127.0.0.1:40001"', 'address = "node_1.corp.example.:40001"', None),
    ('address = "127.0.0.1:0"', 'address = "[::1]:0"', None),
    ('address = "127.0.0.1:0"', 'address = "[::]:0"', None),
    ('address = "127.0.0.1:40001"', 'address = "::1:40001"', "p2p.address: IPv6 address in"),
    ('address = "127.0.0.1:40002"', 'address = "::1:40002"', "rpc.address: IPv6 address in"),
    # (the listen addresses had their own parser: '::1:0' listened on ::1, '[[::1]]:0' failed at bind time)
    ('address = "127.0.0.1:0"', 'address = "::1:0"', "metrics.address: IPv6 address in '::1:0' must be"),
    ('address = "127.0.0.1:0"', 'address = "[[::1]]:0"', "metrics.address: expected [IPV6]:PORT"),
    ('address = "127.0.0.1:0"', 'address = "[host:0"', "metrics.address: expected [IPV6]:PORT"),
    ('address = "127.0.0.1:40001"', 'address = "[alice.example]:40001"', "p2p.address: brackets in"),
    ('address = "127.0.0.1:40001"', 'address = "a..b:40001"', "p2p.address: host 'a..b' is not a host name"),
    ('address = "127.0.0.1:40001"', f'address = "{"x" * 64}.example:40001"', "must be 1..63 letters"),
]  # fmt: skip
MAP_URLS = [
    ("http://[::1]:40000", None),
    ("http://[fe80::1%25eth0]:40000", None),
    ("http://map_1.corp.:40000", None),
    ("http://::1:40000", "network.map_url: IPv6 address in 'http://::1:40000' must be in brackets"),
    # (this one started the node, which then died with a UnicodeError traceback at its first publish)
    ("http://a..b:40000", "network.map_url: host 'a..b' is not a host name"),
    ("http://[::1:40000", "network.map_url: Invalid IPv6 URL"),
]


@pytest.mark.parametrize(("old", "new", "problem"), ADDRESSES, ids=[n for _, n, _ in ADDRESSES])
def test_ipv6_addresses_and_host_names_in_node_toml(
    tmp_path: Path, old: str, new: str, problem: str | None
) -> None:
    path = _write(tmp_path, _replace(old, new))
    if problem is None:
        _config.load_node_config(path)
        return
    with pytest.raises(_config.ConfigError) as info:
        _config.load_node_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and problem in message and "\n" not in message, message


@pytest.mark.parametrize(("url", "problem"), MAP_URLS, ids=[u for u, _ in MAP_URLS])
def test_ipv6_and_named_map_urls(tmp_path: Path, url: str, problem: str | None) -> None:
    path = _write(tmp_path, GOOD + f'\n[network]\nmap_url = "{url}"\n')
    if problem is None:
        assert _config.load_node_config(path).network_map_url == url
        return
    with pytest.raises(_config.ConfigError) as info:
        _config.load_node_config(path)
    assert str(info.value).startswith(f"{path}: {problem}"), info.value


def test_an_ipv6_node_config_round_trips_through_dump(tmp_path: Path) -> None:
    """Every address of an IPv6 node survives ``dump_node_config`` -> ``load_node_config``: the bridge
    endpoint was dumped as ``::1:5672``, which the loader (now rightly) refuses as unbracketed."""
    text = (
        _replace('address = "127.0.0.1:40001"', 'address = "[::1]:40001"\nlisten = "[::]:40001"')
        .replace('address = "127.0.0.1:40002"', 'address = "[::1]:40002"')
        .replace('address = "127.0.0.1:0"', 'address = "[::1]:0"')
        .replace(
            'mode = "in-process"',
            'mode = "external"\nendpoint = "[::1]:5672"\npassword_env = "BRIDGE_PASSWORD"',
        )
    )
    cfg = _config.load_node_config(_write(tmp_path, text))
    assert cfg.bridge_endpoint == ("::1", 5672) and cfg.metrics_address == ("::1", 0)
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "node.toml").write_text(_config.dump_node_config(cfg, copy), encoding="utf-8")
    again = _config.load_node_config(copy / "node.toml")
    assert (again.p2p_address, again.p2p_listen, again.rpc_address) == (
        cfg.p2p_address,
        cfg.p2p_listen,
        cfg.rpc_address,
    )
    assert (again.bridge_endpoint, again.metrics_address) == (cfg.bridge_endpoint, cfg.metrics_address)
